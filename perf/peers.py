"""Benchmark peers: ``python -m perf.peers litserve|hf``.

The same model, on the same machine, served the way many teams would without Switchboard:

  ``litserve``  LitServe with its request batching (``max_batch_size``, ``batch_timeout``),
                streaming; each batch runs Hugging Face ``generate`` until all its rows end.
  ``hf``        a plain Hugging Face ``generate`` behind an HTTP endpoint (FastAPI/uvicorn),
                one request at a time.

Both run the Hugging Face checkpoint in PyTorch and speak one protocol, so the load driver
treats them alike: ``POST /predict`` with JSON ``{"text", "session_id", "max_new_tokens"}``
answers JSON lines ``{"text": delta}`` ... ending with ``{"stats": {...}}``. Both keep each
conversation in process and build prompts exactly as ``chat`` does (template, system prompt,
sliding window), so they see the same prompts; neither reuses KV across turns and neither
has priorities (``priority`` is accepted and ignored).
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import sys
import threading
from pathlib import Path

from perf.peer_model import PeerModel, json_line
from switchboard.client import ChatError, ChatStats
from switchboard.ops.process import wait_until
from switchboard.serving.prompt import PromptTooLong

log = logging.getLogger("switchboard.peers")
PEERS = ("litserve", "hf")


# -- plain Hugging Face generate behind FastAPI -------------------------------------------------
def serve_hf(model: PeerModel, port: int) -> None:
    import uvicorn
    from fastapi import Body, FastAPI, HTTPException
    from fastapi.responses import StreamingResponse

    app = FastAPI(title="Hugging Face generate (benchmark peer)")
    one_at_a_time = threading.Lock()

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.post("/predict")
    def predict(payload: dict = Body(...)):  # noqa: B008 - FastAPI's way to take a JSON body
        try:
            job = model.job(payload)
        except (ValueError, PromptTooLong) as e:
            raise HTTPException(400, str(e)) from None

        def stream():
            with one_at_a_time:
                try:
                    for _ in model.steps([job]):
                        text = model.delta(job)
                        if text:
                            yield json_line({"text": text})
                    yield json_line({"stats": model.finish(job)})
                finally:
                    job.cancelled.set()  # the client left: stop generating for it

        return StreamingResponse(stream(), media_type="application/x-ndjson")

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# -- the driver's client ------------------------------------------------------------------------
class HttpChatClient:
    """The load driver's client for a peer: same events as ``ChatClient.chat`` (str deltas, then
    one ``ChatStats``); errors raise ``ChatError`` with code ``HTTP_<status>``."""

    def __init__(self, url: str, timeout_s: float = 120.0):
        host, _, port = url.rpartition(":")
        self.host, self.port, self.timeout_s = host or "127.0.0.1", int(port), timeout_s

    def ready(self) -> bool:
        try:
            c = http.client.HTTPConnection(self.host, self.port, timeout=2)
            c.request("GET", "/health")
            ok = c.getresponse().status == 200
            c.close()
            return ok
        except OSError:
            return False

    def chat(
        self, text: str, session_id: str | None = None, priority: int = 2, max_new_tokens: int | None = None, **_ignored
    ):
        body = {"text": text, "session_id": session_id, "max_new_tokens": max_new_tokens, "priority": priority}
        c, r = post_stream(self.host, self.port, "/predict", body, self.timeout_s)
        try:
            for line in stream_lines(r, self.timeout_s):
                if not line.strip():
                    continue
                event = json.loads(line)
                if "text" in event:
                    yield event["text"]
                elif "stats" in event:
                    yield ChatStats.from_json(json.dumps(event["stats"]))
                    return
                elif "error" in event:
                    raise ChatError(str(event["error"]), "INTERNAL")
            raise ChatError("stream ended without stats", "INTERNAL")
        finally:
            c.close()


def post_stream(host: str, port: int, path: str, body: dict, timeout_s: float):
    """POST ``body`` as JSON; ``(connection, response)`` once it answers 200 (the caller closes the
    connection), else ``ChatError`` with code ``HTTP_<status>``, DEADLINE_EXCEEDED or UNAVAILABLE."""
    c = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise ChatError(r.read().decode(errors="replace")[:200], f"HTTP_{r.status}")
    except TimeoutError:
        c.close()
        raise ChatError(f"no response within {timeout_s:.0f} s", "DEADLINE_EXCEEDED") from None
    except OSError as e:
        c.close()
        raise ChatError(str(e), "UNAVAILABLE") from None
    except ChatError:
        c.close()
        raise
    return c, r


def stream_lines(r: http.client.HTTPResponse, timeout_s: float):
    """A streamed response's lines until it ends; a stalled or broken stream raises ``ChatError``."""
    while True:
        try:
            line = r.readline()
        except TimeoutError:
            raise ChatError(f"nothing streamed for {timeout_s:.0f} s", "DEADLINE_EXCEEDED") from None
        except (OSError, http.client.HTTPException) as e:
            raise ChatError(f"stream broken: {e}", "UNAVAILABLE") from None
        if not line:
            return
        yield line


def wait_ready(client, timeout: float = 120, proc=None, name: str = "peer") -> None:
    """Until a peer's HTTP client (chat's or speech's: ``ready()``, ``port``) says it is ready;
    fails as soon as ``proc``, the peer's process, exits."""
    wait_until(client.ready, timeout, f"{name} on :{client.port}", proc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.peers", description=__doc__.split("\n\n")[0])
    p.add_argument("peer", choices=PEERS)
    p.add_argument("--checkpoint", type=Path, default=Path("build/default-model"), help="Hugging Face checkpoint")
    p.add_argument(
        "--artifacts",
        type=Path,
        default=Path("model_repository/chat/1"),
        help="tokenizer, chat template and manifest (an installed chat version directory)",
    )
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--threads", type=int, default=2, help="PyTorch intra-op threads on CPU")
    p.add_argument("--max-batch", type=int, default=8, help="LitServe max_batch_size")
    p.add_argument("--batch-timeout", type=float, default=0.005, help="LitServe batch_timeout (s)")
    p.add_argument("--queue-timeout", type=float, default=60, help="LitServe request queue timeout (s)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.peer == "hf":
        serve_hf(PeerModel(args.checkpoint, args.artifacts, args.device, args.threads), args.port)
    else:
        from perf.litserve_peer import serve

        serve(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
