"""The packed pass exported (export/onnx_export.py's ``export_packed``) and run by ONNX Runtime:
on tiny random Llama and Gemma 3 models, the padded PyTorch pass's logits and grown cache, for
each of tests/packed_rows.py's scenarios (one graph per model: the shapes are the graph's inputs)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from switchboard.artifact.geometry import geometry
from switchboard.engine.packing import pack
from switchboard.engine.runtime import OnnxDecoder
from switchboard.export import onnx_export
from tests.packed_rows import SCENARIOS, assert_same_cache, batch, padded_forward, padded_inputs, saved, tiny


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def graph(request, tmp_path_factory):
    model = tiny(request.param)
    path = onnx_export.export_packed(model, geometry(model.config), tmp_path_factory.mktemp("packed") / "model.onnx")
    return model, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), path


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_packed_graph_is_the_padded_pass(graph, scenario):
    model, session, _ = graph
    prefixes, layout, rows = SCENARIOS[scenario]
    past, mask, next_pos = batch(model, prefixes, layout)
    p = pack([new for new, _ in rows], next_pos, mask, [keep for _, keep in rows])
    with torch.no_grad():
        want_logits, want_cache = padded_forward(model, p, past)
    inputs, outputs = onnx_export.packed_io_names(model.config.num_hidden_layers)
    assert [i.name for i in session.get_inputs()] == inputs
    feed = p.inputs()
    pasts = [name for name in inputs if name.startswith("past_key_values")]
    feed |= {name: t.numpy() for name, t in zip(pasts, (a for pair in past for a in pair))}
    logits, *present = session.run(outputs, feed)
    torch.testing.assert_close(torch.from_numpy(logits), want_logits, rtol=1e-5, atol=1e-5)
    assert_same_cache(list(zip(present[::2], present[1::2])), want_cache, p.attention_mask)


@pytest.mark.parametrize("scenario", ["mixed", "decode rows"])
def test_the_runtime_serves_padded_passes_on_the_packed_graph(graph, scenario, tmp_path):
    """``OnnxDecoder`` on a packed graph: a padded pass (``forward``, what every caller feeds) is
    run packed, rows of one length too, with the padded pass's logits and cache."""
    model, _, path = graph
    manifest = saved(model, tmp_path)
    manifest.variants["fp32"] = {"file": path.name, "fingerprint": "packed"}
    decoder = OnnxDecoder(path.parent, manifest, "fp32", threads=1)
    assert decoder.packs
    prefixes, layout, rows = SCENARIOS[scenario]
    past, mask, next_pos = batch(model, prefixes, layout)
    keep = max(k for _, k in rows)
    p = pack([new for new, _ in rows], next_pos, mask, [min(keep, len(new)) for new, _ in rows])
    with torch.no_grad():
        want_logits, want_cache = padded_forward(model, p, past)
    logits, present = decoder.forward(*padded_inputs(p), [(k.numpy(), v.numpy()) for k, v in past], keep=keep)
    got = [logits[row, -k:] for row, (_, k) in enumerate(rows)]
    torch.testing.assert_close(torch.from_numpy(np.concatenate(got)), want_logits, rtol=1e-5, atol=1e-5)
    assert_same_cache(present, want_cache, p.attention_mask)
