"""Installing into the model repository: a rollout's next version staged and checked, and
``make export --install`` putting version 1 back in charge."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from switchboard.artifact.manifest import file_digest
from switchboard.paths import ROOT
from switchboard.repository.install import CHAT_MODELS, install_chat, install_version
from switchboard.repository.versions import Repository, RepositoryError, read_version_info


@pytest.fixture
def repo(tmp_path) -> Repository:
    """The rendered repository's configs and glue, no artifacts."""
    for model in CHAT_MODELS:
        (tmp_path / "repo" / model / "1").mkdir(parents=True)
        shutil.copy(ROOT / "model_repository" / model / "config.pbtxt", tmp_path / "repo" / model / "config.pbtxt")
        shutil.copy(ROOT / "model_repository" / model / "1" / "model.py", tmp_path / "repo" / model / "1" / "model.py")
    return Repository(tmp_path / "repo")


def _artifacts(tmp_path: Path) -> Path:
    d = tmp_path / "artifacts"
    d.mkdir()
    (d / "model.onnx").write_bytes(b"graph")
    digest = file_digest([d / "model.onnx"])
    m = dict(
        name="m", fingerprint="fp", num_layers=1, num_kv_heads=1, head_dim=2, vocab_size=8, context_window=16,
        eos_token_ids=[1], end_of_turn_id=1, system_prompt=None,
        variants={"fp32": {"file": "model.onnx", "fingerprint": "fp", "weights_sha256": digest}},
    )  # fmt: skip
    (d / "manifest.json").write_text(json.dumps(m))
    return d


def test_a_new_version_is_staged_checked_and_named_by_precision(repo, tmp_path):
    artifacts = _artifacts(tmp_path)
    install_version(repo, artifacts, 2, "fp32", tmp_path / "staging")
    assert repo.installed() == [1, 2] and repo.served() == [1]  # installed, not yet served
    for pool in ("engine_short", "engine_long"):
        version = repo.path / pool / "2"
        assert {p.name for p in version.iterdir()} == {"model.py", "model.onnx", "manifest.json", "version.json"}
        assert read_version_info(version)["precision"] == "fp32"
    with pytest.raises(RepositoryError, match="already exists"):
        install_version(repo, artifacts, 2, "fp32", tmp_path / "staging")


def test_installing_version_one_ends_a_rollout(repo, tmp_path):
    artifacts = _artifacts(tmp_path)
    install_version(repo, artifacts, 2, "fp32", tmp_path / "staging")
    repo.set_served([1, 2])
    repo.set_chat(1, 2, 0.5)
    install_chat(artifacts, repo.path)
    assert repo.served() == [1] and repo.installed() == [1]
    assert repo.chat() == {"stable_version": 1, "canary_version": 0, "canary_share": 0.5}
    assert {p.name for p in (repo.path / "chat" / "1").iterdir()} == {
        "model.py",
        "model.onnx",
        "manifest.json",
        "faq.jsonl",
    }
