"""ONNX Runtime's prepared weights: built once per model and machine, memory-mapped by every pool,
the same numbers as the plain graph; and the graph returns the last position's logits only."""

from __future__ import annotations

import threading

import numpy as np

from switchboard.artifact.manifest import Manifest
from switchboard.engine.batch import prefill_inputs
from switchboard.engine.runtime import OnnxDecoder
from switchboard.engine.sizing import MANY_THREADS_FROM_BYTES
from switchboard.runtime.onnx import auto_threads, usable_cores, weights_cache


def _prefill(decoder):
    m = decoder.manifest
    ids, mask, pos, past, _ = prefill_inputs(
        [[5, 6, 7, 8, 9, 10], [11, 12, 13]],
        [0, 0],
        [None, None],
        m.num_layers,
        m.num_kv_heads,
        m.head_dim,
        decoder.dtype,
    )
    return decoder.forward(ids, mask, pos, past)


def test_prepared_weights_are_built_once_and_give_the_plain_graphs_numbers(artifacts, tmp_path):
    manifest = Manifest.load(artifacts)
    plain = OnnxDecoder(artifacts, manifest, "fp32", threads=1)
    decoders: list[OnnxDecoder] = []

    def load():
        decoders.append(OnnxDecoder(artifacts, manifest, "fp32", threads=1, weights_cache=tmp_path))

    threads = [threading.Thread(target=load) for _ in range(2)]  # two pools starting together
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(decoders) == 2 and decoders[0].path == decoders[1].path, "both map the same file"
    assert decoders[0].path.parent.parent == tmp_path and (decoders[0].path.parent / "model.onnx.data").exists()
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 1, "built once"
    logits, present = _prefill(plain)
    for d in decoders:
        other, other_present = _prefill(d)
        np.testing.assert_array_equal(logits, other)
        np.testing.assert_array_equal(present[0][0], other_present[0][0])


def test_only_the_last_positions_logits_leave_the_graph(artifacts):
    manifest = Manifest.load(artifacts)
    logits, present = _prefill(OnnxDecoder(artifacts, manifest, "fp32", threads=1))
    assert logits.shape == (2, 1, manifest.vocab_size)
    assert present[0][0].shape[2] == 6


def test_an_unusable_cache_falls_back_to_a_private_copy(artifacts, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    d = OnnxDecoder(artifacts, Manifest.load(artifacts), "fp32", threads=1, weights_cache=blocked / "cache")
    assert d.path == artifacts / "model.onnx"


def test_thread_and_cache_settings():
    many = MANY_THREADS_FROM_BYTES
    assert auto_threads(many, many) == usable_cores() and auto_threads(30 << 20, many) == 1
    assert auto_threads(many, many, cores=3) == 3
    assert weights_cache("off") is None and weights_cache("/x").as_posix() == "/x"
    assert weights_cache("").name == "weights"
