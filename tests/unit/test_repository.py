"""The model repository's versions and installs: the rollout edits of the configs, a version's
checksums and version.json, a rollout's next version staged and checked, ``make export
--install`` putting version 1 back in charge, the recognizer installed file for file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from switchboard.artifact.manifest import Manifest, file_digest
from switchboard.paths import ROOT
from switchboard.repository.install import CHAT_MODELS, asr_installed, install_asr, install_chat, install_version
from switchboard.repository.versions import (
    ChecksumError,
    ModelVersion,
    Repository,
    RepositoryError,
    read_version_info,
    verify_variant,
)


@pytest.fixture
def repo(tmp_path) -> Repository:
    """The rendered repository's configs and glue, no artifacts."""
    for model in CHAT_MODELS:
        (tmp_path / "repo" / model / "1").mkdir(parents=True)
        shutil.copy(ROOT / "model_repository" / model / "config.pbtxt", tmp_path / "repo" / model / "config.pbtxt")
        shutil.copy(ROOT / "model_repository" / model / "1" / "model.py", tmp_path / "repo" / model / "1" / "model.py")
    return Repository(tmp_path / "repo")


def test_the_repository_edits_change_only_the_rollout_lines(repo):
    before = {p: (repo.path / p / "config.pbtxt").read_text() for p in ("chat", "engine_short", "engine_long")}
    assert repo.served() == [1] and repo.chat() == {"stable_version": 1, "canary_version": 0, "canary_share": 0.1}
    repo.set_served([3, 1])
    repo.set_chat(1, 3, 0.25)
    assert repo.served() == [1, 3] == repo.served("engine_long")
    assert repo.chat() == {"stable_version": 1, "canary_version": 3, "canary_share": 0.25}
    for p, text in before.items():
        after = (repo.path / p / "config.pbtxt").read_text()
        changed = [(a, b) for a, b in zip(text.splitlines(), after.splitlines()) if a != b]
        assert len(text.splitlines()) == len(after.splitlines()) and len(changed) == (1 if p != "chat" else 2)
    (repo.path / "chat" / "config.pbtxt").write_text('name: "chat"\n')
    with pytest.raises(RepositoryError, match="stable_version"):
        repo.set_chat(1, 0)


def _artifact(tmp_path: Path) -> Path:
    d = tmp_path / "7"
    d.mkdir()
    (d / "model.onnx").write_bytes(b"graph")
    (d / "model.onnx.data").write_bytes(b"weights" * 100)
    digest = file_digest([d / "model.onnx", d / "model.onnx.data"])
    m = dict(
        name="m", fingerprint="fp", num_layers=1, num_kv_heads=1, head_dim=2, vocab_size=8, context_window=16,
        eos_token_ids=[1], end_of_turn_id=1, system_prompt=None,
        variants={"fp32": {"file": "model.onnx", "fingerprint": "fp", "weights_sha256": digest}},
    )  # fmt: skip
    (d / "manifest.json").write_text(json.dumps(m))
    return d


def test_a_version_serves_only_weights_matching_its_manifest(tmp_path):
    d = _artifact(tmp_path)
    version = ModelVersion.load(d, "fp32")
    version.verify()
    assert version.number == 7 and version.fingerprint == "fp.v7"  # KV of another version never matches
    (d / "model.onnx.data").write_bytes(b"weights" * 99 + b"weighs")
    with pytest.raises(ChecksumError, match="do not match the manifest"):
        version.verify()
    (d / "model.onnx.data").unlink()
    with pytest.raises(ChecksumError, match="do not match"):  # external data is covered too
        verify_variant(d, Manifest.load(d), "fp32")


def test_a_version_file_names_the_precision_it_serves(tmp_path):
    d = _artifact(tmp_path)
    (d / "version.json").write_text(json.dumps({"precision": "int8-dynamic"}))
    with pytest.raises(ValueError, match="int8-dynamic"):
        ModelVersion.load(d, "fp32")
    (d / "version.json").write_text("[1]")
    with pytest.raises(ValueError, match="version.json"):
        ModelVersion.load(d, "fp32")


def test_a_new_version_is_staged_checked_and_named_by_precision(repo, tmp_path):
    artifacts = _artifact(tmp_path)
    install_version(repo, artifacts, 2, "fp32", tmp_path / "staging")
    assert repo.installed() == [1, 2] and repo.served() == [1]  # installed, not yet served
    for pool in ("engine_short", "engine_long"):
        version = repo.path / pool / "2"
        assert {p.name for p in version.iterdir()} == {
            "model.py",
            "model.onnx",
            "model.onnx.data",
            "manifest.json",
            "version.json",
        }
        assert read_version_info(version)["precision"] == "fp32"
    with pytest.raises(RepositoryError, match="already exists"):
        install_version(repo, artifacts, 2, "fp32", tmp_path / "staging")


def test_installing_version_one_ends_a_rollout(repo, tmp_path):
    artifacts = _artifact(tmp_path)
    install_version(repo, artifacts, 2, "fp32", tmp_path / "staging")
    repo.set_served([1, 2])
    repo.set_chat(1, 2, 0.5)
    install_chat(artifacts, repo.path)
    assert repo.served() == [1] and repo.installed() == [1]
    assert repo.chat() == {"stable_version": 1, "canary_version": 0, "canary_share": 0.5}
    assert {p.name for p in (repo.path / "chat" / "1").iterdir()} == {
        "model.py",
        "model.onnx",
        "model.onnx.data",
        "manifest.json",
        "faq.jsonl",
    }


def _asr_export(out, weights: bytes) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "asr.json").write_text(json.dumps({"source": "m"}))
    (out / "encoder.onnx").write_bytes(weights)
    (out / ".inputs").write_text("digest\n")


def test_installed_compares_file_for_file(tmp_path):
    out, repo = tmp_path / "artifacts", tmp_path / "repo"
    _asr_export(out, b"one")
    assert not asr_installed(out, repo)
    install_asr(out, repo)
    assert asr_installed(out, repo)
    assert not (repo / "asr" / "1" / ".inputs").exists()
    (out / "encoder.onnx").unlink()  # the exporter writes new files, not into the old ones
    (out / "encoder.onnx").write_bytes(b"two")
    assert not asr_installed(out, repo)
