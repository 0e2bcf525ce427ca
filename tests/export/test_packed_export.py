"""``python -m switchboard.export --packed``: FP32 and INT8 dynamic written as the packed pass's
graph beside the padded one, checked, timed against it, and the cheaper one served."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

from switchboard.artifact.manifest import Manifest
from switchboard.engine.runtime import OnnxDecoder
from switchboard.export import packed_choice
from switchboard.export.__main__ import main as export_main
from switchboard.repository.versions import ChecksumError, verify_variant


@pytest.fixture(scope="module")
def exported(tokenizer_dir, tmp_path_factory, checkpoint):
    tmp = tmp_path_factory.mktemp("packed-export")
    ckpt = checkpoint("llama", tokenizer_dir, tmp)
    out = tmp / "artifacts"
    argv = ["--model", str(ckpt), "--out", str(out), "--precision", "fp32,int8-dynamic", "--no-gate"]
    assert export_main([*argv, "--bench-batches", "", "--packed"]) == 0
    return out, Manifest.load(out)


@pytest.mark.parametrize("precision", ["fp32", "int8-dynamic"])
def test_both_graphs_are_recorded_timed_and_the_cheaper_one_serves(exported, precision):
    out, m = exported
    graph = m.variants[precision]["packed"]
    assert (out / graph["file"]).is_file() and graph["file"] != m.variants[precision]["file"]
    choice = m.packing[precision]
    assert set(choice["passes"]) == set(packed_choice.cases([choice["setup"]["chunk"]], choice["setup"]["rows"]))
    worst = max(r["ms"]["packed"] / min(r["ms"]["padded"], r["ms"]["per_length"]) for r in choice["passes"].values())
    assert choice["worst_ratio"] == round(worst, 3)
    assert choice["chosen"] == ("packed" if worst <= 1 else "padded")
    assert OnnxDecoder(out, m, precision).packs == (choice["chosen"] == "packed")
    assert not OnnxDecoder(out, m, precision, pack=False).packs, "packed_passes off: the padded graph"
    verify_variant(out, m, precision)
    assert not list(out.glob("model.smoothed*")), "the smoothed graphs INT8 was made from are gone"


def test_the_packed_graph_computes_the_padded_graphs_pass(exported):
    out, m = exported
    forced = Manifest(**{**asdict(m), "packing": {v: {"chosen": "packed"} for v in m.variants}})
    for precision, atol in (("fp32", 1e-4), ("int8-dynamic", 0.5)):
        padded, packed = OnnxDecoder(out, m, precision, pack=False), OnnxDecoder(out, forced, precision)
        assert packed.packs and not padded.packs
        ids = np.array([[0, 0, 11, 12], [21, 22, 23, 24]], np.int64)  # row 0 left-padded
        mask = (ids != 0).astype(np.int64)
        pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        want, _ = padded.forward(ids, mask, pos, padded.empty_past(2), keep=2)
        got, _ = packed.forward(ids, mask, pos, packed.empty_past(2), keep=2)
        np.testing.assert_allclose(got, want, atol=atol)
        assert (got.argmax(-1) == want.argmax(-1)).all(), precision


def test_a_modified_packed_graph_is_refused(exported, tmp_path):
    out, m = exported
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in out.iterdir():
        if f.is_file():
            (copy / f.name).write_bytes(f.read_bytes())
    with open(copy / m.variants["fp32"]["packed"]["file"], "ab") as f:
        f.write(b"\0")
    with pytest.raises(ChecksumError, match="packed"):
        verify_variant(copy, m, "fp32")
