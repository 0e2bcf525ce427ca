"""INT8 variants for ONNX Runtime on CPU, calibrated on customer-service prompts.

Static Q/DQ with MinMax calibration, weight MatMuls only (the attention score MatMuls and
the tied lm_head stay FP32): quantizing every op broke a trained tiny model here, weight
MatMuls kept ~99.8% of teacher-forced tokens. Q/DQ is also the form TensorRT consumes.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                      quantize_static)

log = logging.getLogger(__name__)


def weight_matmuls(model_path: Path) -> list[str]:
    model = onnx.load(str(model_path), load_external_data=False)
    weights = {init.name for init in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and any(i in weights for i in n.input)]


class PromptReader(CalibrationDataReader):
    """Feeds of single prompts (prefill from an empty past) and of decode steps on top of them."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)


def calibration_feeds(decoder, prompts: list[list[int]]) -> list[dict[str, np.ndarray]]:
    from switchboard.engine.batch import prefill_inputs

    m = decoder.manifest
    feeds = []
    for prompt in prompts:
        ids, mask, pos, past, _ = prefill_inputs([prompt], [0], [None], m.num_layers, m.num_kv_heads,
                                                 m.head_dim, decoder.dtype)
        feed = {"input_ids": ids, "attention_mask": mask, "position_ids": pos}
        for i, (k, v) in enumerate(past):
            feed[f"past_key_values.{i}.key"], feed[f"past_key_values.{i}.value"] = k, v
        feeds.append(feed)
        logits, present = decoder.forward(ids, mask, pos, past)
        step = {"input_ids": logits[:, -1:].argmax(-1).astype(np.int64),
                "attention_mask": np.ones((1, mask.shape[1] + 1), np.int64),
                "position_ids": np.asarray([[len(prompt)]], np.int64)}
        for i, (k, v) in enumerate(present):
            step[f"past_key_values.{i}.key"], step[f"past_key_values.{i}.value"] = k, v
        feeds.append(step)
    return feeds


def quantize_int8_static(fp32: Path, out: Path, feeds: list[dict[str, np.ndarray]]) -> Path:
    nodes = weight_matmuls(fp32)
    log.info("INT8 static Q/DQ: %d weight MatMuls, %d calibration feeds", len(nodes), len(feeds))
    quantize_static(str(fp32), str(out), PromptReader(feeds), quant_format=QuantFormat.QDQ,
                    nodes_to_quantize=nodes, per_channel=True, weight_type=QuantType.QInt8,
                    activation_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
                    extra_options={"ActivationSymmetric": False, "WeightSymmetric": True})
    return out
