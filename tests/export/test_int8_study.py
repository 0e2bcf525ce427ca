"""The INT8 study (export/int8_study.py) on a tiny Gemma 3 checkpoint: both graphs exported and
gated, outliers measured per layer before and after smoothing, one report."""

from __future__ import annotations

import json

import torch

from switchboard.export import int8_study


def test_study_reports_the_gate_both_ways_and_the_outliers(tokenizer_dir, tmp_path, checkpoint):
    from transformers import AutoModelForCausalLM

    ckpt = checkpoint("gemma3_text", tokenizer_dir, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    with torch.no_grad():  # outlier channels in front of every projection, as real models have
        for layer in model.model.layers:
            layer.input_layernorm.weight[:2] = 30.0
            layer.pre_feedforward_layernorm.weight[3:5] = 20.0
    model.save_pretrained(ckpt)
    out = tmp_path / "study"
    argv = ["--model", str(ckpt), "--out", str(out), "--precision", "fp32,int8-dynamic", "--heldout-per-class", "4"]
    assert int8_study.main(argv) == 0
    result = json.loads((out / "study.json").read_text())
    assert set(result["runs"]) == {"plain", "smoothed"}
    assert result["runs"]["smoothed"]["smoothing"]["applied"] and not result["runs"]["plain"]["smoothing"]["applied"]
    for run in result["runs"].values():
        assert "int8-dynamic" in run["accuracy"]
    plain, smoothed = result["outliers"]["plain"], result["outliers"]["smoothed"]
    assert len(plain) == len(smoothed) == 3
    assert all(s["qkv"]["ratio"] < p["qkv"]["ratio"] for p, s in zip(plain, smoothed))
    text = (out / "study.md").read_text()
    assert "| plain | int8-dynamic |" in text and "| smoothed | int8-dynamic |" in text and "| 2 |" in text
