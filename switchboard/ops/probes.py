"""The supervisor's probes: real requests that show a model serving, because Triton 2.51 keeps
a model whose Python-backend stub died READY while every request to it fails. One token from
each engine pool (pinged while it waits: a request sent as the stub died can go unanswered), a
priority-1 chat, and a second of silence to the speech models. Each gives the failure, headed
by the model that failed (``model_of``), or None."""

from __future__ import annotations

import queue
import time

import numpy as np

# the speech models load once a recognizer is built: watched, not probed each round
from switchboard.repository.models import CHAT, POOL_MODELS, SPEECH

POOLS = POOL_MODELS
PROBE_TEXT = "Where is my order?"
WARM_UP_TOKENS = 8  # past the first token: the warm-up runs decode steps too


def _pool_request(
    url: str, model: str, timeout_s: float, ping_every_s: float = 1.0, version: str | None = None
) -> str | None:
    """One token from an engine pool over a stream; the failure, or None. While the token has
    not come, the pool is pinged every ``ping_every_s`` on the same stream: a request sent as
    the stub died can go unanswered for good, and the ping sent after it is refused at once
    ("Stub process ... is not healthy"), so the probe fails then, not at its deadline."""
    import tritonclient.grpc as grpcclient

    from switchboard.client.sync import close_stream, error_of
    from switchboard.wire import channel_args

    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url, channel_args=channel_args(private=True))
    ids = grpcclient.InferInput("input_ids", [1, 3], "INT32")
    ids.set_data_from_numpy(np.asarray([[1, 2, 3]], np.int32))
    limit = grpcclient.InferInput("max_new_tokens", [1, 1], "INT32")
    limit.set_data_from_numpy(np.asarray([[1]], np.int32))
    finished = pinged = False  # finished: nothing left open on the stream, it may close cleanly
    try:
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer(model, [ids, limit], model_version=version or "", request_id="token")
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                result, error = got.get(timeout=max(0.0, min(left, ping_every_s)))
            except queue.Empty:
                if left <= ping_every_s:
                    return f"{model}: no answer within {timeout_s:.0f} s"
                client.async_stream_infer(
                    model, [ids], model_version=version or "", request_id="ping", parameters={"ping": True}, priority=1
                )
                pinged = True
                continue
            if error is not None:  # the token's or a ping's: either fails the probe
                finished = not pinged  # else the token's request may still be open
                return f"{model}: {error_of(error)[1]}"
            if result.get_response().id == "ping":
                continue  # alive: the token may still come
            if result.as_numpy("stats") is not None:
                finished = not pinged  # a ping may still be open
                return None
    except Exception as e:  # the server is gone or refused the stream
        return f"{model}: {e}"
    finally:
        try:
            close_stream(client, cancel=not finished)
        except Exception:
            pass


def _speech_request(url: str, model: str, timeout_s: float, version: str | None = None) -> str | None:
    """A second of silence to ``asr`` or ``voice_chat``: any answer of the model's own (an empty
    transcript; voice_chat's UNAVAILABLE while asr is not loaded) shows its stub alive."""
    from switchboard.asr.audio import encode_wav
    from switchboard.codec import build_request
    from switchboard.serving.engine_client import EngineClient, EngineStreamError, stub_dead
    from switchboard.wire import Asr, untag

    request = build_request(
        model,
        {Asr.AUDIO: np.asarray([[encode_wav(np.zeros(16_000, np.float32))]], np.object_)},
        ["result" if model == "asr" else "stats"],
        priority=1,
        version=int(version or 0),
    )
    client = EngineClient(url)
    try:
        for _ in client.stream(request, timeout_s):
            return None
        return f"{model}: no answer"
    except EngineStreamError as e:
        status, message = untag(str(e))
        return f"{model}: {message}" if status is None or stub_dead(message) else None
    finally:
        client.close()


def probe(url: str, timeout_s: float = 20.0, max_new_tokens: int = 1) -> str | None:
    """One token from each pool, then a priority-1 chat of one token; the first failure or None,
    headed by the model that failed (``model_of``). Pools first: once Triton has seen a stub
    die, the pool refuses at once ("not healthy"), where a chat routed to it can still wait out
    chat's bound on the pool. (A request sent in the first moments after the kill can still get
    no answer at all: it costs the whole deadline.)"""
    for model in (*POOLS, CHAT):
        failure = probe_model(url, model, timeout_s, max_new_tokens)
        if failure is not None:
            return failure
    return None


def probe_model(
    url: str, model: str, timeout_s: float = 20.0, max_new_tokens: int = 1, version: str | None = None
) -> str | None:
    """One model's probe: a pool's token (``version``: that version's, else Triton's choice), or
    ``chat``'s priority-1 chat. An FAQ answer because a pool failed counts as a failure of chat;
    one because of load does not."""
    if model in SPEECH:
        return _speech_request(url, model, timeout_s, version)
    if model != CHAT:
        return _pool_request(url, model, timeout_s, version=version)
    from switchboard.client import ChatClient, ChatError

    try:
        reply = ChatClient(url, timeout_s=timeout_s, private_connection=True).chat(
            PROBE_TEXT, stream=False, priority=1, max_new_tokens=max_new_tokens
        )
    except ChatError as e:
        if e.code == "UNAVAILABLE" and str(e).startswith("overloaded"):
            return None  # serving, but shedding load: restarting would make it worse
        return f"chat: {e}" + (f" ({e.code})" if e.code else "")
    except Exception as e:
        return f"chat: {e}"
    if reply.stats.fallback and reply.stats.raw.get("fallback_reason") == "engine_error":
        return "chat: answered from the FAQ because a pool failed"
    return None


def model_of(failure: str) -> str | None:
    """The model a probe's failure names, or None (the server itself)."""
    head = failure.split(":", 1)[0]
    return head if head in (*POOLS, CHAT, *SPEECH) else None
