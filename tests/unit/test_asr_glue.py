"""The asr glue with a stubbed ``triton_python_backend_utils``: its choice of runtime
(asr/config.pbtxt's ``runtime``, ``device``, ``torch_dtype``, ``torch_steps``: a wrong value fails the load
naming the parameter, and ``runtime: torch`` names the checkpoint it needs when it is not
there), and its way back (deltas queued off the decoding loop, coalesced, the end last)."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time

import pytest

from switchboard.asr.metrics import AsrMetrics
from switchboard.asr.runtime import AsrManifest
from switchboard.wire import AsrResult
from tests.unit.pb_stub import forget, stub_glue


@pytest.fixture
def glue(monkeypatch):
    yield stub_glue(monkeypatch, "switchboard.triton.asr_model")
    forget("switchboard.triton.asr_model")


@pytest.fixture
def version(tmp_path):
    """A version directory whose manifest names a checkpoint that does not exist."""
    special = {"start": 1, "eos": 2, "notimestamps": 3}
    manifest = AsrManifest(
        "m", str(tmp_path / "gone"), 80, 3000, 1500, 448, False, {"en": None}, special, [], [], 1, 1, 4, 8
    )
    manifest.save(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"runtime": "tensorrt"}, "'runtime' = 'tensorrt'"),
        ({"runtime": "torch", "device": "gpu0"}, "'device' = 'gpu0'"),
        ({"runtime": "torch", "device": "cuda:x"}, "'device' = 'cuda:x'"),
        ({"runtime": "torch", "torch_dtype": "int8"}, "'torch_dtype' = 'int8'"),
        ({"runtime": "torch", "torch_steps": "sometimes"}, "'torch_steps' = 'sometimes'"),
        ({"runtime": "torch", "device": "cpu", "torch_steps": "graphs"}, "graphs needs a CUDA device, not 'cpu'"),
    ],
)
def test_a_wrong_runtime_setting_fails_the_load_naming_it(glue, version, changes, named):
    with pytest.raises(glue.ConfigError, match=named):
        glue.TritonPythonModel()._load_model(version, dataclasses.replace(glue.AsrConfig(), **changes))


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1"])
def test_the_torch_runtime_names_the_checkpoint_it_cannot_find(glue, version, device):
    cfg = dataclasses.replace(glue.AsrConfig(), runtime="torch", device=device)
    with pytest.raises(FileNotFoundError, match=f"{version / 'gone'}.*asr.json's source"):
        glue.TritonPythonModel()._load_model(version, cfg)


@pytest.mark.parametrize(("installed", "served"), [(14, 14), (448, 448), (600, 448)])
def test_the_torch_runtime_keeps_the_installed_transcript_budget_when_smaller(
    glue, version, monkeypatch, installed, served
):
    """A random-weight checkpoint never ends a transcript, so a bench installs it with a budget
    (asr.json's max_target_positions, what ONNX serves); the checkpoint's own is the most."""
    checkpoint = version / "gone"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    manifest = json.loads((version / "asr.json").read_text())
    (version / "asr.json").write_text(json.dumps(manifest | {"max_target_positions": installed}))

    class Loaded:
        manifest = AsrManifest.load(version)

    Loaded.manifest = dataclasses.replace(Loaded.manifest, max_target_positions=448)
    monkeypatch.setattr(glue.AsrModel, "from_checkpoint", classmethod(lambda cls, *a, **kw: Loaded()))
    cfg = dataclasses.replace(glue.AsrConfig(), runtime="torch", device="cpu", torch_steps="static")
    assert glue.TritonPythonModel()._load_model(version, cfg).manifest.max_target_positions == served


# -- the way back: queued by the batch worker, sent by the sender thread -----------------------


class Sender:
    def __init__(self, gate=None):
        self.sent, self.gate, self.entered = [], gate, threading.Event()

    def send(self, response, flags=0):
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        self.sent.append((response, flags))


class Request:
    def __init__(self, sender, cancelled=False):
        self.sender, self.cancelled = sender, cancelled

    def get_response_sender(self):
        return self.sender

    def is_cancelled(self):
        return self.cancelled


@pytest.fixture
def way_back(glue):
    watch = glue.CancelWatch("asr", 0.005)
    sender = glue.ResponseSender("asr", watch)
    yield glue, sender, watch
    sender.close()
    watch.close()


def _texts(sender):
    return [r.outputs["text"][0][0].decode() for r, flags in sender.sent if r.error is None and not flags]


def _final(sender, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not any(flags for _, flags in sender.sent):
        assert time.monotonic() < deadline, "no final response"
        time.sleep(0.002)
    [(response, _)] = [(r, f) for r, f in sender.sent if f]
    return response


def test_deltas_queued_while_a_send_is_slow_leave_in_one_response_before_the_final(way_back):
    glue, sender_thread, watch = way_back
    gate = threading.Event()
    first, second = Sender(gate), Sender()
    metrics = AsrMetrics()
    sink = glue.TritonSink(Request(first), 2, sender_thread.outbox, watch, metrics)
    sink.emit(" Where")  # the sender thread takes it and waits in send...
    assert first.entered.wait(10)
    for text in (" is", " my", " order?"):  # ...while the worker goes on queueing
        sink.emit(text)
    result = AsrResult(" Where is my order?".strip(), "en", 2.0, [], 10.0, 1.0, 1, 1)
    sink.finish(result)
    gate.set()
    final = _final(first)
    assert _texts(first) == [" Where", " is my order?"]
    assert json.loads(final.outputs["result"][0][0])["text"] == "Where is my order?"
    assert first.sent[-1][0] is final  # nothing after the final
    assert not second.sent
    counts, observed = metrics.drain()
    assert counts == {
        ("requests_total", (("outcome", "transcribed"),)): 1,
        ("audio_seconds_total", (("priority", "2"),)): 2.0,
    }
    assert sorted(observed) == [
        ("batch_chunks", (), 1.0),
        ("duration_seconds", (("priority", "2"),), 0.01),
        ("queue_seconds", (("priority", "2"),), 0.001),
    ]


def test_a_request_that_asked_for_the_result_alone_gets_one_response(way_back):
    glue, sender_thread, watch = way_back
    sender = Sender()
    sink = glue.TritonSink(Request(sender), 2, sender_thread.outbox, watch, AsrMetrics(), deltas=False)
    for text in (" Where", " is", " my order?"):
        sink.emit(text)
    sink.finish(AsrResult("Where is my order?", "en", 2.0, [], 10.0, 1.0, 1, 1))
    final = _final(sender)
    assert [r for r, _ in sender.sent] == [final] and not _texts(sender)
    assert json.loads(final.outputs["result"][0][0])["text"] == "Where is my order?"


def test_a_cancelled_request_ends_cancelled_and_is_no_longer_asked_after_its_end(way_back):
    glue, sender_thread, watch = way_back
    request = Request(Sender(), cancelled=True)
    metrics = AsrMetrics()
    sink = glue.TritonSink(request, 1, sender_thread.outbox, watch, metrics)
    assert not sink.cancelled()  # the first question puts it under watch
    deadline = time.monotonic() + 10
    while not sink.cancelled():
        assert time.monotonic() < deadline
        time.sleep(0.002)
    sink.finish(AsrResult("", "en", 1.0, [], 1.0, 0.0, 1, 1))
    final = _final(request.sender)
    assert final.error.code == "CANCELLED"
    assert sink.final_sent and sink not in watch._live
    assert metrics.drain() == ({("requests_total", (("outcome", "cancelled"),)): 1}, [])  # not counted transcribed


@pytest.mark.parametrize(
    ("error", "code", "message", "outcome"),
    [
        ("bad", "INVALID_ARG", "[not_audio] no", "invalid"),
        ("full", "UNAVAILABLE", "full", "unavailable"),
        ("bug", "INTERNAL", "internal error", "error"),
    ],
)
def test_errors_end_the_stream_with_their_code_and_are_counted(way_back, error, code, message, outcome):
    glue, sender_thread, watch = way_back
    failure = {
        "bad": glue.AsrRequestError("not_audio", "no"),
        "full": glue.AsrRequestError("unavailable", "full"),
        "bug": RuntimeError("boom"),
    }[error]
    request = Request(Sender())
    metrics = AsrMetrics()
    glue.TritonSink(request, 2, sender_thread.outbox, watch, metrics).fail(failure)
    final = _final(request.sender)
    assert final.error.code == code and message in final.error.message
    assert metrics.drain() == ({("requests_total", (("outcome", outcome),)): 1}, [])


@pytest.mark.parametrize(
    ("encoder_bytes", "positions", "threads"),
    [
        (2_324_646, 125, 1),  # the embedded default: 0.15 GFLOP a window
        (37_724_186, 1500, 3),  # tiny.en: 28
        (2_000_000, 1000, 3),  # 1.0: the threshold itself pays
    ],
)
def test_threads_0_is_one_for_a_model_whose_window_is_little_work(
    glue, tmp_path, monkeypatch, encoder_bytes, positions, threads
):
    """``threads`` 0 sizes ONNX Runtime from the encoder's arithmetic for one window; a set
    value is taken as it is."""
    special = {"start": 1, "eos": 2, "notimestamps": 3}
    files = {"fp32": {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}}
    manifest = AsrManifest(
        "m",
        "src",
        80,
        2 * positions,
        positions,
        448,
        False,
        {"en": None},
        special,
        [],
        [],
        1,
        1,
        4,
        8,
        precisions=files,
    )
    manifest.save(tmp_path)
    (tmp_path / "encoder.onnx").write_bytes(b"\0" * encoder_bytes)
    loaded = []
    monkeypatch.setattr(
        glue.AsrModel, "load", lambda version, precision, threads, fitted_windows: loaded.append(threads)
    )
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    model = glue.TritonPythonModel()
    model._load_model(tmp_path, glue.AsrConfig())
    model._load_model(tmp_path, dataclasses.replace(glue.AsrConfig(), threads=2))
    assert loaded == [threads, 2]


def test_windows_are_fitted_to_the_audio_unless_set_whole(glue):
    cfg = glue.AsrConfig()
    gpu = dataclasses.replace(cfg, runtime="torch", device="cuda:1")
    assert cfg.windows == "fitted" and cfg.fitted_windows() and gpu.fitted_windows()
    assert not dataclasses.replace(gpu, windows="whole").fitted_windows()
    for old in ("auto", "short"):
        with pytest.raises(ValueError, match=f"parameter 'windows' = '{old}': expected fitted or whole"):
            dataclasses.replace(cfg, windows=old).fitted_windows()


def test_threads_0_uses_every_core_when_the_encoder_cannot_be_sized(tmp_path):
    from switchboard.asr.runtime import MANY_THREADS_FROM_FLOPS, encoder_flops
    from switchboard.runtime.onnx import auto_threads

    manifest = AsrManifest("m", "src", 80, 3000, 1500, 448, False, {"en": None}, {}, [], [], 1, 1, 4, 8)
    assert auto_threads(encoder_flops(tmp_path, manifest), MANY_THREADS_FROM_FLOPS, 4) == 4
