"""``python -m switchboard.ops.voice join``: a recognizer retrained or re-exported since it was
installed is installed again, not served stale; one that is current is left as it is."""

import argparse
import json

from switchboard.ops import voice


def _export(out, weights: bytes) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "asr.json").write_text(json.dumps({"source": "m"}))
    (out / "encoder.onnx").write_bytes(weights)
    (out / ".inputs").write_text("digest\n")


def test_join_installs_a_stale_export_again(tmp_path, monkeypatch):
    model, repo, run_dir = tmp_path / "whisper", tmp_path / "repo", tmp_path / "run"
    model.mkdir()
    (model / "config.json").write_text("{}")
    run_dir.mkdir()
    monkeypatch.setattr(voice.paths, "BUILD", tmp_path / "build")
    out = tmp_path / "build" / "artifacts" / "asr" / "whisper"
    exported = {"weights": b"old"}
    ran, loaded = [], []

    def run(self, cmd):
        ran.append(cmd)
        _export(out, exported["weights"])

    monkeypatch.setattr(voice.Joiner, "run", run)
    monkeypatch.setattr(voice, "load_model", lambda url, name, key: loaded.append(name))
    monkeypatch.setattr(voice, "operator_key", lambda run_dir: "key")
    args = argparse.Namespace(
        model=model, precision="default", repository=repo, run_dir=run_dir, http_port=8000, force=False
    )
    stages = []
    monkeypatch.setattr(voice.Joiner, "stage", lambda self, name, **kw: stages.append(name))

    assert voice.Joiner(args).join() == 0
    assert (repo / "asr" / "1" / "encoder.onnx").read_bytes() == b"old"
    assert "installing" in stages and loaded == ["asr"]

    stages.clear()
    assert voice.Joiner(args).join() == 0  # nothing changed: exported (up to date), not installed
    assert "exporting" in stages and "installing" not in stages and len(ran) == 2

    exported["weights"] = b"new"  # retrained: the exporter writes a new export
    (out / "encoder.onnx").unlink()
    stages.clear()
    assert voice.Joiner(args).join() == 0
    assert "installing" in stages
    assert (repo / "asr" / "1" / "encoder.onnx").read_bytes() == b"new"
    assert not any("--force" in cmd for cmd in ran)

    stages.clear()
    args.force = True  # exported and installed again, current or not
    assert voice.Joiner(args).join() == 0
    assert "--force" in ran[-1] and "installing" in stages


def test_the_default_recognizer_is_converted_not_trained(tmp_path, monkeypatch):
    """Whisper base, converted from its pinned packages, is what `make serve` joins; the small
    recognizer trained on corpus/ is built only when asked for by its folder; any other
    checkpoint is taken as it is."""
    monkeypatch.setattr(voice.paths, "BUILD", tmp_path)
    assert voice.DEFAULT_MODEL.name == "asr-whisper-base"
    stage, cmd = voice.builder(tmp_path / "asr-whisper-base")
    assert "Whisper base" in stage and cmd[2:] == [
        "switchboard.checkpoints.whisper_ct2",
        "--source",
        "base",
        "--out",
        str(tmp_path / "asr-whisper-base"),
    ]
    assert voice.builder(tmp_path / "asr-tiny-en")[1][2:5] == [
        "switchboard.checkpoints.whisper_ct2",
        "--source",
        "tiny.en",
    ]
    assert voice.builder(tmp_path / "asr-default-model")[1][2] == "switchboard.training.asr"
    assert voice.builder(tmp_path / "elsewhere" / "whisper-small") is None
