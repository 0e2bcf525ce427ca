"""INT8 variants for ONNX Runtime on CPU (and the Q/DQ form TensorRT consumes).

- ``int8-dynamic``: weights INT8, activations quantized on the fly (ORT's advice for
  transformers on CPU); no calibration.
- ``int8-minmax`` / ``int8-entropy`` / ``int8-percentile``: static Q/DQ with activation
  ranges calibrated on customer-service prompts (``export.calibration``).

Which MatMuls are quantized is a choice of *parts*: ``mlp`` (gate/up/down or c_fc/c_proj),
``attention`` (q/k/v/o projections) and ``lm_head``. The default, ``mlp,attention``, keeps the
LM head (and everything that is not a weight MatMul: norms, softmax, attention scores) in
FP32: quantizing every op broke a trained tiny model here, weight MatMuls kept ~99.8% of
teacher-forced tokens. Parts are found through the module path the exporter records on
every node (``pkg.torch.onnx.name_scopes``), so this works for every supported family.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

log = logging.getLogger(__name__)

PARTS = ("mlp", "attention", "lm_head")
DEFAULT_PARTS = ("mlp", "attention")
METHODS = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}
# Entropy and Percentile build histograms per tensor and need every feed to have one shape.
FIXED_SHAPE_METHODS = {"entropy", "percentile"}


def _scope(node) -> str:
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            return prop.value
    return node.name


def part_of(scope: str) -> str | None:
    if "lm_head" in scope:
        return "lm_head"
    if ".mlp." in scope or ".mlp'" in scope:
        return "mlp"
    if ".self_attn." in scope or ".attn." in scope or ".self_attn'" in scope or ".attn'" in scope:
        return "attention"
    return None


def weight_matmuls(model_path: Path) -> dict[str, list[str]]:
    """Node names of the MatMul/Gemm nodes that multiply by a weight, by part."""
    model = onnx.load(str(model_path), load_external_data=False)
    weights = {init.name for init in model.graph.initializer}
    # A weight may reach its MatMul through a Transpose (tied embeddings, Conv1D layouts).
    transposed = {n.output[0] for n in model.graph.node if n.op_type == "Transpose" and n.input[0] in weights}
    parts: dict[str, list[str]] = {p: [] for p in PARTS}
    for n in model.graph.node:
        if n.op_type in ("MatMul", "Gemm") and any(i in weights or i in transposed for i in n.input[1:2]):
            part = part_of(_scope(n))
            if part:
                parts[part].append(n.name)
    return parts


def select(model_path: Path, parts: tuple[str, ...]) -> list[str]:
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; choose from {', '.join(PARTS)}")
    found = weight_matmuls(model_path)
    nodes = [n for p in parts for n in found[p]]
    if not nodes:
        raise ValueError(f"no weight MatMuls found for parts {parts} in {model_path}")
    return nodes


class FeedReader(CalibrationDataReader):
    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self._feeds = feeds
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)

    def rewind(self):
        self._it = iter(self._feeds)


def fold_weight_transposes(fp32: Path, nodes: list[str], out: Path) -> Path | None:
    """A copy of ``fp32`` where the selected MatMuls that read a weight through a Transpose (the
    output projection of tied embeddings) read a transposed copy of it instead, which dynamic
    quantization needs (it quantizes constant B inputs only). None when there is nothing to fold."""
    model = onnx.load(str(fp32), load_external_data=False)
    weights = {init.name: init for init in model.graph.initializer}
    transposes = {n.output[0]: n for n in model.graph.node if n.op_type == "Transpose" and n.input[0] in weights}
    wanted = set(nodes)
    targets = [n for n in model.graph.node if n.name in wanted and n.input[1] in transposes]
    if not targets:
        return None
    model = onnx.load(str(fp32))  # with the weights now
    weights = {init.name: init for init in model.graph.initializer}
    names = {n.name for n in targets}
    for node in (n for n in model.graph.node if n.name in names):
        source = transposes[node.input[1]]
        perm = next((list(a.ints) for a in source.attribute if a.name == "perm"), None)
        folded = numpy_helper.to_array(weights[source.input[0]]).transpose(perm)
        name = f"{source.input[0]}.transposed"
        if name not in weights:
            weights[name] = numpy_helper.from_array(np.ascontiguousarray(folded), name)
            model.graph.initializer.append(weights[name])
        node.input[1] = name
    large = sum(len(init.raw_data) for init in model.graph.initializer) > (1 << 30)
    onnx.save(model, str(out), save_as_external_data=large, location=f"{out.name}.data")
    return out


def quantize_int8_dynamic(fp32: Path, out: Path, parts: tuple[str, ...] = DEFAULT_PARTS) -> Path:
    nodes = select(fp32, parts)
    log.info("INT8 dynamic: %d weight MatMuls (%s)", len(nodes), ",".join(parts))
    folded = fold_weight_transposes(fp32, nodes, out.with_name(out.stem + ".folded.onnx"))
    try:
        _quantize_dynamic(folded or fp32, out, nodes)
    finally:
        if folded is not None:
            for f in out.parent.glob(folded.name + "*"):
                f.unlink()
    return out


def _quantize_dynamic(fp32: Path, out: Path, nodes: list[str]) -> None:
    quantize_dynamic(
        str(fp32),
        str(out),
        weight_type=QuantType.QInt8,
        nodes_to_quantize=nodes,
        per_channel=True,
        extra_options={"MatMulConstBOnly": True},
    )


def quantize_int8_static(
    fp32: Path,
    out: Path,
    feeds: list[dict[str, np.ndarray]],
    method: str = "minmax",
    parts: tuple[str, ...] = DEFAULT_PARTS,
) -> Path:
    nodes = select(fp32, parts)
    log.info(
        "INT8 static Q/DQ (%s): %d weight MatMuls (%s), %d calibration feeds",
        method,
        len(nodes),
        ",".join(parts),
        len(feeds),
    )
    extra = {"ActivationSymmetric": False, "WeightSymmetric": True}
    if method == "percentile":
        extra["CalibPercentile"] = 99.99
    # op_types_to_quantize limits calibration to the tensors around MatMuls, the only ones the
    # Q/DQ nodes need. Without it ONNX Runtime builds a histogram of every tensor in the graph,
    # among them the empty past KV of a prefill (a 0/0 in its percentile) and the attention
    # mask's -3.4e38 fill (an overflow in its bin widths).
    quantize_static(
        str(fp32),
        str(out),
        FeedReader(feeds),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=["MatMul", "Gemm"],
        nodes_to_quantize=nodes,
        per_channel=True,
        weight_type=QuantType.QInt8,
        activation_type=QuantType.QInt8,
        calibrate_method=METHODS[method],
        extra_options=extra,
    )
    return out
