"""The PyTorch runtime (the GPU path without TensorRT) against ONNX Runtime, on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

from switchboard.artifact.manifest import Manifest
from switchboard.artifact.tokenizer import TextTokenizer
from switchboard.engine.runtime import OnnxDecoder
from switchboard.engine.scheduler import Engine, GenerationRequest
from switchboard.engine.torch_runtime import TorchDecoder
from tests.model.test_engine import Sink

CHECKPOINT = "build/default-model"


def test_torch_runtime_matches_onnx_and_drives_the_engine(artifacts):
    import torch

    from tests.conftest import ROOT

    manifest = Manifest.load(artifacts)
    onnx = OnnxDecoder(artifacts, manifest, "fp32", threads=2)
    torch_rt = TorchDecoder(ROOT / CHECKPOINT, manifest, "cpu")
    rng = np.random.default_rng(0)
    ids = rng.integers(5, manifest.vocab_size, (2, 7))
    mask = np.ones((2, 7), np.int64)
    mask[1, :3] = 0  # left padding
    pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
    a_logits, a_present = onnx.forward(ids, mask, pos, onnx.empty_past(2))
    b_logits, b_present = torch_rt.forward(ids, mask, pos, torch_rt.empty_past(2))
    assert np.abs(a_logits[:, -1] - b_logits[:, -1]).max() < 1e-3
    # one decode step on top of the cache
    step = np.argmax(a_logits[:, -1], -1)[:, None]
    mask2 = np.concatenate([mask, np.ones((2, 1), np.int64)], 1)
    a2, _ = onnx.forward(step, mask2, pos[:, -1:] + 1, a_present)
    b2, b_grown = torch_rt.forward(step, mask2, pos[:, -1:] + 1, b_present)
    assert np.abs(a2 - b2).max() < 1e-3
    # the cache stays on the device between steps, in the model's dtype
    assert isinstance(b_grown[0][0], torch.Tensor) and b_grown[0][0].dtype == torch_rt.model_dtype

    for prefill_budget in (0, 3):  # whole prompts; chunks, each on the cache of those before
        outputs, caches = [], []
        for decoder in (onnx, torch_rt):
            engine = Engine(
                decoder, max_batch=4, max_waiting=8, stop_ids=set(manifest.eos_token_ids), prefill_budget=prefill_budget
            )
            sinks = [Sink() for _ in range(3)]
            for i, sink in enumerate(sinks):
                request = GenerationRequest(prompt=list(ids[0, : 4 + i]), max_new_tokens=12, return_cache=True)
                engine.submit(request, sink)
            while any(s.result is None for s in sinks):
                engine.step()
            outputs.append([s.tokens for s in sinks])
            caches.append([s.result.cache for s in sinks])
        assert outputs[0] == outputs[1]
        for a, b in zip(*caches):  # a session's stored cache comes back to the host, as ONNX's
            assert b.dtype == a.dtype and b.shape == a.shape and np.abs(a - b).max() < 1e-3

    # a follow-up on a stored prefix (from the host) gives the same tokens as on ONNX Runtime
    follow = []
    for decoder, cache in zip((onnx, torch_rt), caches):
        engine = Engine(decoder, max_batch=4, max_waiting=8, stop_ids=set(manifest.eos_token_ids))
        prefix = list(ids[0, :4]) + outputs[0][0][:-1]
        sink = Sink()
        request = GenerationRequest(
            prompt=prefix + [int(ids[1, 5])], max_new_tokens=8, reused=len(prefix), past=cache[0]
        )
        engine.submit(request, sink)
        while sink.result is None:
            engine.step()
        follow.append(sink.tokens)
    assert follow[0] == follow[1]


def test_a_checkpoint_of_another_shape_is_refused_before_its_weights_are_read(artifacts, tmp_path):
    import json

    from tests.conftest import ROOT

    config = json.loads((ROOT / CHECKPOINT / "config.json").read_text())
    config["num_hidden_layers"] += 1
    (tmp_path / "config.json").write_text(json.dumps(config))  # and no weights beside it
    with pytest.raises(ValueError, match=r"not the model the repository was exported from \(num_layers \d+ != \d+"):
        TorchDecoder(tmp_path, Manifest.load(artifacts), "cpu")


def test_packed_passes_answer_as_padded_ones(artifacts):
    """On ``runtime: torch`` the engine packs the passes whose rows differ (prompts of different
    lengths prefilled together, rows verifying drafts of different lengths, each draft whole,
    prompts' chunks in the running rows' pass): the answers are those of padded passes decoding
    a token at a time, prompts prefilled apart."""
    from tests.conftest import ROOT
    from tests.model.test_engine import QUESTIONS, prompt, run, speculation

    manifest = Manifest.load(artifacts)
    onnx = OnnxDecoder(artifacts, manifest, "fp32", threads=2)
    model = (manifest, onnx, TextTokenizer(artifacts))  # what tests/model/test_engine.py's helpers take
    torch_rt = TorchDecoder(ROOT / CHECKPOINT, manifest, "cpu")
    prompts = [prompt(model, ("user", q)) for q in QUESTIONS]
    assert len({len(p) for p in prompts}) > 1, "prompts of different lengths: a padded prefill would pad"

    def answers(later: bool = False, **kw):
        """``later``: the first question decodes a few steps alone, the others join it then, in
        chunks of 16 prompt tokens."""
        e = Engine(torch_rt, max_batch=8, max_waiting=16, stop_ids=set(manifest.eos_token_ids), **kw)
        requests = [GenerationRequest(p, 40, logprobs=1) for p in prompts]
        if not later:
            return run(e, requests), e.snapshot()[0]
        sinks = [Sink() for _ in requests]
        e.submit(requests[0], sinks[0])
        for _ in range(3):
            e.step()
        for r, sink in zip(requests[1:], sinks[1:]):
            e.submit(r, sink)
        while any(sink.result is None for sink in sinks):
            e.step()
        return sinks, e.snapshot()[0]

    padded, padded_stats = answers(pack=False)
    packed, stats = answers(speculation=speculation(model))
    mixed, mixed_stats = answers(later=True, prefill_budget=16)
    for arm in (packed, mixed):
        assert [s.tokens for s in arm] == [s.tokens for s in padded]
        for a, b in zip(arm, padded):
            chosen = [[lp for entry in s.logprobs for lp, _ in entry] for s in (a, b)]
            np.testing.assert_allclose(*chosen, atol=1e-4)
    assert padded_stats["packed_passes"] == 0 and stats["packed_passes"] >= 2  # the prefill, verifying steps
    assert stats["accepted_tokens"] > 0 and stats["prefill_padded_tokens"] == stats["prefill_tokens"]
    assert mixed_stats["mixed_passes"] >= 2  # the later prompts' chunks rode in the first one's steps


def test_the_packing_benchmark_runs_its_three_arms(artifacts):
    """``python -m perf drafts --packing``: the same answers in each arm (it asserts that), the
    packed arm's verifying passes packed, the padded arm's not."""
    from perf.drafts import packing
    from tests.conftest import ROOT

    arms = packing(ROOT / CHECKPOINT, artifacts, rounds=1)
    assert list(arms) == ["plain", "drafts, padded", "drafts, packed"]
    assert arms["drafts, padded"]["packed_passes"] == 0 and arms["drafts, padded"]["verify_steps"] > 0
    assert arms["drafts, packed"]["packed_passes"] > 0 and arms["drafts, packed"]["verify_steps"] > 0


def test_a_prompts_chunks_ride_in_the_decoding_rows_passes(artifacts):
    """``python -m perf mixed-passes``' run: a 40-token prompt in chunks of 16 beside decoding
    rows takes 3 passes; mixed, the rows get a token in each, apart only in the 2 decode steps
    between the chunks."""
    from perf.mixed_passes import arrival, manifest
    from tests.conftest import ROOT

    decoder = TorchDecoder(ROOT / CHECKPOINT, manifest(ROOT / CHECKPOINT, artifacts), "cpu")
    mixed = arrival(decoder, rows=2, prompt_tokens=40, budget=16, pack=True, seed=1)
    apart = arrival(decoder, rows=2, prompt_tokens=40, budget=16, pack=False, seed=1)
    assert (mixed["tokens_meanwhile"], apart["tokens_meanwhile"]) == (3, 2)
    assert mixed["ttft_ms"] > 0 and apart["longest_gap_ms"] > 0
