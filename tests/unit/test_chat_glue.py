"""The ``chat`` model's Triton glue with a stubbed ``triton_python_backend_utils``: requests in,
responses out, every error with its code and a final flag. The turn itself is faked here
(tests/unit/test_turn.py tests it)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from switchboard.serving.canary import VersionPicker
from switchboard.serving.gate import PriorityGate
from switchboard.serving.metrics import ChatMetrics
from switchboard.serving.pool_stream import EngineError
from switchboard.serving.request import ChatRequest, Limits, RequestError
from switchboard.serving.turn import Cancelled
from switchboard.wire import ChatStats
from tests.unit.pb_stub import FINAL, Tensor, forget, stub_glue

CHAT = ChatRequest("hi", None, 16, 0.0, 1.0, 2, None)


@pytest.fixture
def glue(monkeypatch):
    yield stub_glue(monkeypatch, "switchboard.triton.chat_model")
    forget("switchboard.triton.chat_model")


class Sender:
    def __init__(self):
        self.sent = []

    def send(self, response, flags=0):
        self.sent.append((response, flags))


class Request:
    def __init__(self, text, parameters=None, cancelled=False):
        self.inputs = {} if text is None else {"text": Tensor("text", np.asarray([text.encode()], np.object_))}
        self.params, self.cancelled, self.sender = json.dumps(parameters or {}), cancelled, Sender()

    def get_response_sender(self):
        return self.sender

    def parameters(self):
        return self.params

    def is_cancelled(self):
        return self.cancelled


class Admission:
    """Runs each admitted chat at once, on the caller's thread."""

    def __init__(self, run):
        self.run = run

    def wait_for_room(self, timeout):
        return True

    def submit(self, job, priority):
        self.run(job)


class Turn:
    def __init__(self, outcome=None):
        self.outcome, self.ran = outcome, []

    def run(self, chat, sink, cancelled, t0):
        self.ran.append(chat)
        if self.outcome is not None:
            raise self.outcome
        sink.text("你好", chat.priority)
        sink.final(ChatStats(generated_tokens=2, route="short", priority=chat.priority), "!", chat.priority)

    def answer_from_faq(self, chat, sink, t0, reason, session):
        sink.final(ChatStats(fallback=True, fallback_reason=reason, session=session), "FAQ", chat.priority)


def _model(glue, turn, faq=True):
    model = glue.TritonPythonModel()
    model.limits, model.gate, model.cancel_poll_s = Limits(), PriorityGate(), 0.05
    model.picker, model.turns = VersionPicker(1), {1: turn}
    model.faq = object() if faq else None
    model.admission = Admission(model._serve)
    model.metrics, model.breaker = ChatMetrics(), None
    return model


def _counted(model) -> dict:
    counts, _ = model.metrics.drain()
    return {labels[0][1]: n for (name, labels), n in counts.items() if name == "requests_total"}


def _error(sender):
    [(response, flags)] = sender.sent
    assert flags == FINAL and response.error is not None
    return response.error


def test_a_chat_streams_text_then_a_final_response_with_stats(glue):
    model = _model(glue, Turn())
    request = Request("你好", {"chat_priority": 1})
    model.execute([request])
    (text, f1), (final, f2) = request.sender.sent
    assert text.outputs["text_output"][0][0].decode() == "你好" and f1 == 0
    assert final.outputs["text_output"][0][0] == b"!" and f2 == FINAL
    stats = json.loads(final.outputs["stats"][0][0])
    assert stats["generated_tokens"] == 2 and stats["priority"] == 1 and stats["route"] == "short"
    assert _counted(model) == {"generated": 1}


def test_bad_input_is_invalid_arg_naming_the_field_and_never_reaches_the_turn(glue):
    turn = Turn()
    model = _model(glue, turn)
    request = Request(None)
    model.execute([request])
    error = _error(request.sender)
    assert error.code == "INVALID_ARG"
    assert error.message == "[INVALID_ARG] text: required input is missing (or send tool_results)"
    assert turn.ran == [] and _counted(model) == {"invalid": 1}


@pytest.mark.parametrize(
    "outcome,code,message,counted",
    [
        (RequestError("prompt: too long"), "INVALID_ARG", "prompt: too long", "invalid"),
        (EngineError("engine_short: died"), "UNAVAILABLE", "engine_short: died", "unavailable"),
        (Cancelled(), "CANCELLED", "cancelled by the client", "cancelled"),
        (KeyError("secret detail"), "INTERNAL", "internal error", "error"),
    ],
)
def test_each_failure_of_a_turn_ends_the_stream_with_its_code(glue, outcome, code, message, counted):
    request = Request("hi")
    model = _model(glue, Turn(outcome))
    model.execute([request])
    error = _error(request.sender)
    assert error.code == code and error.message == f"[{code}] {message}"  # no traceback, no detail
    assert _counted(model) == {counted: 1}


def test_a_chat_whose_client_left_before_its_slot_is_not_run(glue):
    turn = Turn()
    request = Request("hi", cancelled=True)
    _model(glue, turn).execute([request])
    assert _error(request.sender).code == "CANCELLED" and turn.ran == []


def test_a_shed_chat_gets_the_faq_or_unavailable_without_one(glue):
    model = _model(glue, Turn())
    request = Request("hi")
    model._shed(glue._Job(request, request.sender, CHAT, 0.0, 1), "queue_timeout")
    [(response, flags)] = request.sender.sent
    stats = json.loads(response.outputs["stats"][0][0])
    assert flags == FINAL and stats["fallback_reason"] == "queue_timeout" and stats["session"] == "skipped"
    request = Request("hi")
    _model(glue, Turn(), faq=False)._shed(glue._Job(request, request.sender, CHAT, 0.0, 1), "queue_full")
    assert _error(request.sender).code == "UNAVAILABLE"


class ToolTurn:
    """Answers with a call of each of ``tools`` (OpenAI's deltas: the name, then arguments)."""

    def __init__(self, *tools):
        self.tools = tools

    def run(self, chat, sink, cancelled, t0):
        for i, name in enumerate(self.tools):
            sink.tool_calls([{"index": i, "id": f"call_{i}", "function": {"name": name, "arguments": ""}}], 2)
            sink.tool_calls([{"index": i, "function": {"arguments": '{"reason": "complaint"}'}}], 2)
        sink.final(ChatStats(generated_tokens=9, route="short", session="miss"), "", chat.priority)


def _business(model) -> dict:
    counts, _ = model.metrics.drain()
    names = ("conversations_total", "tool_calls_total", "handovers_total", "abandoned_total")
    return {(name, labels): n for (name, labels), n in counts.items() if name in names}


def test_an_answer_that_calls_transfer_to_human_counts_a_hand_over_and_its_calls(glue):
    model = _model(glue, ToolTurn("transfer_to_human", "lookup_weather"))
    model.execute([Request("I want to complain, get me someone")])
    assert _business(model) == {
        ("conversations_total", ()): 1,  # a one-off chat: a conversation of its own
        ("tool_calls_total", (("tool", "transfer_to_human"),)): 1,
        ("tool_calls_total", (("tool", "other"),)): 1,  # the client's own tools: one label value
        ("handovers_total", ()): 1,
    }


def test_a_client_gone_before_its_turn_ran_is_abandoned_waiting_after_answering(glue):
    model = _model(glue, Turn())
    model.execute([Request("hi", cancelled=True)])
    assert _business(model) == {("abandoned_total", (("stage", "waiting"),)): 1}
    model = _model(glue, Turn(Cancelled()))
    model.execute([Request("hi")])
    counts, _ = model.metrics.drain()
    assert counts["abandoned_total", (("stage", "answering"),)] == 1
    assert counts["requests_total", (("outcome", "cancelled"), ("version", "1"))] == 1
