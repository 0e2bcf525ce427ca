"""Dynamic INT8 of the output projection of tied embeddings, which reaches its MatMul through a
Transpose: folded into a weight of its own so the quantizer can take it (the embedding stays
FP32 for its lookup; a decode step reads the INT8 copy)."""

from __future__ import annotations

import numpy as np
import onnx

from switchboard.artifact.manifest import Manifest
from switchboard.engine.batch import prefill_inputs
from switchboard.engine.runtime import OnnxDecoder
from switchboard.export.quantize import quantize_int8_dynamic, select


def test_the_tied_output_projection_is_quantized(artifacts, tmp_path):
    fp32 = artifacts / "model.onnx"
    out = tmp_path / "model.int8-dynamic.onnx"
    quantize_int8_dynamic(fp32, out, ("mlp", "attention", "lm_head"))
    head = select(fp32, ("lm_head",))
    graph = onnx.load(str(out), load_external_data=False).graph
    assert not [n for n in graph.node if n.name in head and n.op_type == "MatMul"], "lm_head still FP32"
    assert not list(tmp_path.glob("*.folded.onnx*")), "the folded copy is removed"
    assert any(n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul") and "lm_head" in n.input[1] for n in graph.node)

    manifest = Manifest.load(artifacts)
    manifest.variants["test"] = {"file": out.name}
    (tmp_path / "manifest.json").write_text((artifacts / "manifest.json").read_text())
    a = OnnxDecoder(artifacts, manifest, "fp32", threads=1)
    b = OnnxDecoder(tmp_path, manifest, "test", threads=1)
    m = manifest
    feed = prefill_inputs([[5, 6, 7, 8]], [0], [None], m.num_layers, m.num_kv_heads, m.head_dim, a.dtype)[:4]
    x, y = a.forward(*feed)[0][0, -1], b.forward(*feed)[0][0, -1]
    assert np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y)) > 0.99
