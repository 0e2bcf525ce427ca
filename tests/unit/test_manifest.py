"""The export's manifest as a server reads it: a newer export's keys on an older server."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict

import pytest

from switchboard.artifact.manifest import MANIFEST, Manifest

BASE = Manifest("m", "fp", 2, 1, 8, 100, 64, [1], 2, None)


def test_a_manifest_round_trips(tmp_path):
    BASE.save(tmp_path)
    assert Manifest.load(tmp_path) == BASE


def test_keys_of_a_newer_export_are_left_aside_with_a_warning(tmp_path, caplog):
    (tmp_path / MANIFEST).write_text(json.dumps(asdict(BASE) | {"packed_passes": {"enabled": True}}))
    with caplog.at_level(logging.WARNING, "switchboard.artifact"):
        assert Manifest.load(tmp_path) == BASE
    assert "packed_passes" in caplog.text


def test_a_manifest_missing_a_required_key_is_a_clear_error(tmp_path):
    data = asdict(BASE)
    del data["fingerprint"]
    (tmp_path / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(ValueError, match="not a manifest this version reads.*fingerprint"):
        Manifest.load(tmp_path)


def test_a_variant_serves_its_packed_graph_only_where_the_export_chose_it():
    packed = {"file": "model.packed.onnx", "weights_sha256": "ab", "bytes": 3}
    variants = {"fp32": {"file": "model.onnx", "fingerprint": "f1", "packed": packed}, "int8": {"file": "q.onnx"}}
    m = Manifest(**{**asdict(BASE), "variants": variants, "packing": {"fp32": {"chosen": "packed"}}})
    graph = m.graph("fp32")
    assert graph["file"] == "model.packed.onnx" and graph["fingerprint"] == "f1.packed"
    assert m.graph("fp32", pack=False)["file"] == "model.onnx", "packed_passes off: the padded graph"
    assert m.graph("int8")["file"] == "q.onnx", "no packed rendering"
    padded = Manifest(**{**asdict(m), "packing": {"fp32": {"chosen": "padded"}}})
    assert padded.graph("fp32")["file"] == "model.onnx"
    older = Manifest(**{**asdict(m), "packing": {}})  # an export from before the choice
    assert older.graph("fp32")["file"] == "model.onnx"
