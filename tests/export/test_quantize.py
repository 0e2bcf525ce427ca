"""INT8 variants (dynamic; static Q/DQ with MinMax, Entropy, Percentile), part selection,
validation of the Q/DQ graphs with ONNX Runtime, and the accuracy gate."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from switchboard.artifact.manifest import Manifest
from switchboard.engine.runtime import OnnxDecoder
from switchboard.export import quantize
from switchboard.export.__main__ import DEFAULT_PRECISIONS, parse_precisions
from switchboard.export.__main__ import main as export_main

ALL = "fp32,int8-dynamic,int8-minmax,int8-entropy,int8-percentile"


@pytest.fixture(scope="module")
def exported(tokenizer_dir, tmp_path_factory, checkpoint):
    tmp = tmp_path_factory.mktemp("q")
    ckpt = checkpoint("llama", tokenizer_dir, tmp)
    out = tmp / "artifacts"
    assert (
        export_main(
            [
                "--model",
                str(ckpt),
                "--out",
                str(out),
                "--precision",
                ALL,
                "--int8-parts",
                "mlp",
                "--calibration-per-class",
                "2",
                "--no-gate",
                "--bench-batches",
                "1,8",
            ]
        )
        == 0
    )
    return out


def test_parts_are_found_by_module_path(exported):
    parts = quantize.weight_matmuls(exported / "model.onnx")
    assert len(parts["mlp"]) == 2 * 3 and len(parts["attention"]) == 2 * 4


def test_every_variant_is_valid_and_runs_in_onnx_runtime(exported):
    m = Manifest.load(exported)
    assert set(m.variants) == set(ALL.split(","))
    assert len({v["fingerprint"] for v in m.variants.values()}) == 5
    ops = {v: {n.op_type for n in onnx.load(str(exported / m.variants[v]["file"])).graph.node} for v in m.variants}
    for v in ("int8-minmax", "int8-entropy", "int8-percentile"):
        assert {"QuantizeLinear", "DequantizeLinear"} <= ops[v], v  # Q/DQ, the form TensorRT consumes
    assert "DynamicQuantizeLinear" in ops["int8-dynamic"] or "MatMulInteger" in ops["int8-dynamic"]
    for v in m.variants:
        onnx.checker.check_model(str(exported / m.variants[v]["file"]))
        d = OnnxDecoder(exported, m, v)
        ids = np.asarray([[5, 6, 7]], np.int64)
        logits, present = d.forward(ids, np.ones((1, 3), np.int64), np.arange(3)[None], d.empty_past(1))
        assert np.isfinite(logits).all() and present[0][0].shape[2] == 3


def test_only_selected_parts_are_quantized(exported):
    m = Manifest.load(exported)
    graph = onnx.load(str(exported / m.variants["int8-minmax"]["file"])).graph
    int8_weights = {i.name for i in graph.initializer if i.data_type == onnx.TensorProto.INT8}
    dequantized = [n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in int8_weights]
    assert len(dequantized) == 2 * 3  # the MLP weights of both layers; attention stays FP32


def test_report_is_written(exported):
    text = (exported / "report.md").read_text()
    assert "int8-entropy" in text and "decode b8" in text
    assert (exported / "report.png").stat().st_size > 1000


# A gate no INT8 variant can pass (teacher-forced top-1 above 1), the other metrics off.
UNREACHABLE_TOP1 = ["--calibration-per-class", "1", "--min-greedy", "0", "--min-cosine", "0",
                    "--max-ppl-increase", "100", "--min-top1", "1.01", "--bench-batches", ""]  # fmt: skip


def test_accuracy_gate_fails_the_export_with_a_clear_message(tokenizer_dir, tmp_path, checkpoint):
    ckpt = checkpoint("llama", tokenizer_dir, tmp_path)
    with pytest.raises(
        SystemExit, match=r"accuracy gate failed \(not shipping\): int8-dynamic: teacher-forced top-1 .* < 1.01$"
    ):
        export_main(
            ["--model", str(ckpt), "--out", str(tmp_path / "a"), "--precision", "fp32,int8-dynamic", *UNREACHABLE_TOP1]
        )


def test_default_precision_leaves_out_a_failing_int8_variant_and_says_why(tokenizer_dir, tmp_path, checkpoint, capfd):
    ckpt = checkpoint("llama", tokenizer_dir, tmp_path)
    out = tmp_path / "a"
    assert export_main(["--model", str(ckpt), "--out", str(out), "--heldout-per-class", "2", *UNREACHABLE_TOP1]) == 0
    m = Manifest.load(out)
    assert set(m.variants) == {"fp32"} and set(m.left_out) == {"int8-dynamic", "int8-percentile"}
    assert "teacher-forced top-1" in m.left_out["int8-dynamic"][0]
    assert not list(out.glob("model.int8-*"))
    terminal = capfd.readouterr().out
    assert "left out int8-dynamic: teacher-forced top-1" in terminal
    with pytest.raises(ValueError, match="'int8-dynamic' was left out by the accuracy gate .*teacher-forced top-1"):
        OnnxDecoder(out, m, "int8-dynamic")


def test_precision_argument():
    assert parse_precisions("default") == (list(DEFAULT_PRECISIONS), {"fp32"})
    assert parse_precisions("fp32, int8-dynamic") == (["fp32", "int8-dynamic"], {"fp32", "int8-dynamic"})
    for bad in ("int8-dynamic", "fp32,int4"):
        with pytest.raises(ValueError, match="fp32 is required"):
            parse_precisions(bad)
