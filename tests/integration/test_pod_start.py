"""A Switchboard pod's start on this machine: the container's command from deploy/k8s (the
supervisor with its probe port, Redis elsewhere) on free ports. Not ready until the warm-up chat
has answered; the series the HPA scales on are on the metrics port; SIGTERM stops it cleanly.
And `python -m perf.cold_start` measures such a start, a spoken question included."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request

import openai
import pytest
import yaml

from perf.cold_start import pod_command, spoken_question
from switchboard import paths
from switchboard.asr.wer import error_rate
from switchboard.client import ChatClient
from switchboard.ops.health_server import LIVENESS_PATH, READINESS_PATH
from switchboard.ops.launch import Ports, Stack, free_port
from switchboard.ops.process import alive
from tests.integration.gatewaytools import Gateway


def _get(port: int, path: str) -> tuple[int | None, dict | None]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except OSError:
        return None, None


@pytest.fixture(scope="module")
def pod(artifacts, tmp_path_factory):
    run = tmp_path_factory.mktemp("pod")
    ports, probe_port = Ports.free(), free_port()
    redis = Stack(ports, run_dir=run)
    redis.start_redis()
    log = run / "supervisor.log"
    proc = subprocess.Popen(
        pod_command(ports, probe_port, redis.redis_url, paths.MODEL_REPOSITORY, run),
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    answers = []  # every /readyz answer until the first 200
    deadline = time.monotonic() + 300
    while not answers or answers[-1][0] != 200:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"not ready: {answers[-3:]}\n{log.read_text()[-3000:]}"
        status, body = _get(probe_port, READINESS_PATH)
        if status is not None:
            answers.append((status, body))
        time.sleep(0.05)
    yield types.SimpleNamespace(proc=proc, ports=ports, probe_port=probe_port, run=run, answers=answers, log=log)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
    redis.stop_redis()


def test_the_pod_is_ready_only_after_its_warm_up_answered(pod):
    assert pod.answers[0][0] == 503, "tritonserver takes seconds to load: the first answer is not ready"
    reasons = {body["reason"] for status, body in pod.answers if status == 503}
    assert reasons <= {"warming up", "tritonserver is not running"}, reasons
    assert "warm-up answered: ready" in pod.log.read_text()
    state = json.loads((pod.run / "supervisor.json").read_text())
    assert state["probes"] >= 1 and state["failures"] == 0 and state["ready"] is True, state
    assert _get(pod.probe_port, LIVENESS_PATH) == (200, {"ok": True, "reason": None})
    reply = ChatClient(f"127.0.0.1:{pod.ports.grpc}", timeout_s=60).chat(
        "Where is my order?", session_id="pod-start", stream=False, max_new_tokens=8
    )
    assert reply.text and not reply.stats.fallback and reply.stats.session == "miss"


def _series(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def test_the_series_the_hpa_scales_on_are_exported(pod):
    config = yaml.safe_load(
        next(yaml.safe_load_all((paths.K8S / "monitoring" / "prometheus-adapter.yaml").read_text()))["data"][
            "config.yaml"
        ]
    )
    names = [re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["seriesQuery"]).group(0) for rule in config["rules"]]
    ttft_name = "switchboard_chat_time_to_first_token_seconds_bucket"
    assert ttft_name in names
    deadline = time.monotonic() + 30  # chat publishes its metrics once a second
    while True:
        series = _series(pod.ports.metrics)
        ttft = [v for k, v in series.items() if k.startswith(ttft_name) and 'le="+Inf"' in k and 'route="short"' in k]
        if sum(ttft) >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for name in names:
        assert any(k == name or k.startswith(name + "{") for k in series), name
    assert sum(ttft) >= 1, "the warm-up's time to first token is in the histogram"


def test_the_gateway_deployment_serves_a_pods_chat_and_speech(pod):
    """The gateway as deploy/k8s/gateway.yaml runs it (its address and gRPC target replaced by
    this machine's), in front of the pod: a chat and a transcription through the official client."""
    manifest = next(
        d for d in yaml.safe_load_all((paths.K8S / "gateway.yaml").read_text()) if d["kind"] == "Deployment"
    )
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    assert container["command"][1:] == ["-m", "switchboard.gateway"], "what Gateway starts"
    args = [a for a in container["args"] if not a.startswith(("--host=", "--port=", "--grpc-url="))]
    gateway = Gateway(f"127.0.0.1:{pod.ports.grpc}", pod.run, *args, keys=False)
    try:
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0, timeout=120)
        reply = client.chat.completions.create(
            model="switchboard", messages=[{"role": "user", "content": "Where is my order?"}], max_tokens=8
        )
        assert reply.choices[0].message.content
        wav, text = spoken_question(paths.MODEL_REPOSITORY, 0)
        heard = client.audio.transcriptions.create(file=("q.wav", wav), model="switchboard-asr")
        assert error_rate([text], [heard.text]) <= 0.5, (text, heard.text)
    finally:
        gateway.stop()


def test_sigterm_stops_the_pod_cleanly(pod):
    triton = json.loads((pod.run / "supervisor.json").read_text())["tritonserver_pid"]
    pod.proc.send_signal(signal.SIGTERM)
    assert pod.proc.wait(timeout=90) == 0
    assert not alive(triton)


def test_the_cold_start_tool_measures_a_start(artifacts, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "perf.cold_start", "--runs", "1", "--out", str(tmp_path)],
        cwd=paths.ROOT,  # the bench suite runs from the checkout, not the wheel
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = json.loads((tmp_path / "summary.json").read_text())
    assert run["triton_ready_s"] <= run["ready_s"] <= run["first_text_s"] <= run["answer_s"], run
    assert run["fallback"] is False and run["pss_mib"] > 0 and "stop_s" in run
    # make test installs tiny.en as the recognizer: the pod serves voice, and heard the question
    assert run["answer_s"] <= run["voice_heard_s"] <= run["voice_first_text_s"], run
    assert run["voice_fallback"] is False and run["voice_ttft_ms"] > 0, run
    assert error_rate([run["spoken"]], [run["heard"]]) <= 0.5, run
    summary = (tmp_path / "summary.md").read_text()
    assert "/readyz 200 (warm-up answered)" in summary and "first voice chat: first text" in summary
