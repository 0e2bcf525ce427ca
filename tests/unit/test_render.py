"""The model repository rendered for each target, checked against what it should be."""

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from switchboard.artifact.manifest import Manifest
from switchboard.paths import ROOT
from switchboard.repository.render import TARGETS, render

MANIFEST = Manifest(
    name="tiny",
    fingerprint="fp",
    num_layers=2,
    num_kv_heads=2,
    head_dim=8,
    vocab_size=100,
    context_window=64,
    eos_token_ids=[1],
    end_of_turn_id=1,
    system_prompt=None,
)


def parse(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def params(cfg) -> dict[str, str]:
    return {k: v.string_value for k, v in cfg.parameters.items()}


def test_local_rendering_is_the_committed_repository(tmp_path):
    render("local", tmp_path)
    rendered = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert [str(p) for p in rendered] == [
        "asr/1/model.py",
        "asr/config.pbtxt",
        "chat/1/model.py",
        "chat/config.pbtxt",
        "engine_long/1/model.py",
        "engine_long/config.pbtxt",
        "engine_short/1/model.py",
        "engine_short/config.pbtxt",
        "voice_chat/1/model.py",
        "voice_chat/config.pbtxt",
    ]
    for rel in rendered:
        assert (tmp_path / rel).read_text() == (ROOT / "model_repository" / rel).read_text(), rel


@pytest.mark.parametrize("target", TARGETS)
def test_every_config_is_a_valid_triton_model_config(target, tmp_path):
    for path in render(target, tmp_path, MANIFEST):
        cfg = parse(path)
        assert cfg.name == path.parent.name


def test_chat_and_the_pools_skip_tritons_batcher():
    # Triton 2.51's dynamic batcher held a request that arrived while the one instance ran execute
    # for its 500 ms idle timeout; chat and the engines order by priority themselves.
    chat = parse(ROOT / "model_repository/chat/config.pbtxt")
    assert chat.model_transaction_policy.decoupled and chat.max_batch_size == 1
    assert not chat.HasField("dynamic_batching") and float(params(chat)["queue_timeout_s"]) > 0
    for pool, batch in (("short", "16"), ("long", "8")):
        cfg = parse(ROOT / f"model_repository/engine_{pool}/config.pbtxt")
        assert not cfg.HasField("dynamic_batching")
        assert params(cfg)["max_batch"] == batch and params(cfg)["runtime"] == "onnxruntime"


def test_ngc_onnxruntime_serves_the_graph_natively_on_the_gpu(tmp_path):
    render("ngc-onnxruntime", tmp_path, MANIFEST)
    decoder = parse(tmp_path / "decoder/config.pbtxt")
    assert decoder.backend == "onnxruntime" and decoder.max_batch_size == 0
    assert decoder.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    dims = {i.name: list(i.dims) for i in decoder.input}
    assert dims["past_key_values.1.value"] == [-1, 2, -1, 8] and len(dims) == 3 + 2 * 2
    assert {o.name: list(o.dims) for o in decoder.output}["logits"] == [-1, -1, 100]
    for pool in ("short", "long"):
        assert params(parse(tmp_path / f"engine_{pool}/config.pbtxt"))["runtime"] == "triton:decoder"


def test_ngc_tensorrt_serves_one_engine_with_a_profile_per_pool(tmp_path):
    render("ngc-tensorrt", tmp_path, MANIFEST)
    decoder = parse(tmp_path / "decoder/config.pbtxt")
    assert decoder.platform == "tensorrt_plan" and decoder.default_model_filename == "model.plan"
    assert len(decoder.instance_group) == 1 and decoder.instance_group[0].count == 1, "one copy of the weights"
    assert list(decoder.instance_group[0].profile) == ["0", "1"]
    assert not list(tmp_path.glob("decoder_*")), "no engine per pool"
    for pool in ("short", "long"):
        assert params(parse(tmp_path / f"engine_{pool}/config.pbtxt"))["runtime"] == "triton:decoder"


def test_unknown_target_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown target 'docker'"):
        render("docker", tmp_path)


def test_the_configuration_reference_is_current():
    from switchboard.repository.config import REFERENCE, reference

    assert REFERENCE.read_text() == reference(), "run: python -m switchboard.repository.config"


def test_every_rendered_parameter_is_a_typed_setting_with_its_default():
    from switchboard.repository.config import ChatConfig, EngineConfig

    chat = params(parse(ROOT / "model_repository/chat/config.pbtxt"))
    assert set(chat) == {f for f, _, _ in ChatConfig().parameters()}
    assert ChatConfig.load({"parameters": {k: {"string_value": v} for k, v in chat.items()}}, "chat") == ChatConfig()
    short = params(parse(ROOT / "model_repository/engine_short/config.pbtxt"))
    loaded = EngineConfig.load({"parameters": {k: {"string_value": v} for k, v in short.items()}}, "engine_short")
    assert loaded == EngineConfig(max_batch=16)


def test_chat_reads_the_pools_rows_from_their_config_and_sizes_its_admission(monkeypatch, tmp_path):
    from switchboard.repository.config import ChatConfig, admission_slots, pool_config

    repo = ROOT / "model_repository"
    assert pool_config(repo, "engine_short").max_batch + pool_config(repo, "engine_long").max_batch == 24
    monkeypatch.setenv("SWITCHBOARD_MAX_BATCH", "1")  # the pools' own override applies
    assert pool_config(repo, "engine_short").max_batch == 1
    with pytest.raises(ValueError, match="engine_gone/config.pbtxt"):
        pool_config(tmp_path, "engine_gone")
    auto = ChatConfig()
    assert admission_slots(auto, compute_bound=False, pool_rows=24) == (64, 16), "the default model: as before"
    assert admission_slots(auto, compute_bound=True, pool_rows=24) == (32, 8), "a compute-bound one: rows + a third"
    assert admission_slots(auto, compute_bound=True, pool_rows=2) == (3, 0)
    assert admission_slots(ChatConfig(max_inflight=16, max_inflight_reserved=4), True, 24) == (16, 4), "explicit"
