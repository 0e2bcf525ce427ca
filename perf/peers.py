"""Benchmark peers: ``python -m switchboard.perf.peers litserve|hf``.

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
import queue
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from switchboard.artifact.manifest import Manifest
from switchboard.artifact.tokenizer import TextTokenizer
from switchboard.client import ChatError, ChatStats
from switchboard.serving.detok import IncrementalDetokenizer
from switchboard.serving.prompt import Conversation, Prompt, PromptBuilder, PromptTooLong

log = logging.getLogger("switchboard.peers")
PEERS = ("litserve", "hf")


@dataclass
class Job:
    prompt: Prompt
    session_id: str | None
    detok: IncrementalDetokenizer
    tokens: list[int] = field(default_factory=list)
    done: bool = False
    cancelled: threading.Event = field(default_factory=threading.Event)


class PeerModel:
    """A Hugging Face checkpoint in PyTorch with ``chat``'s prompt building and in-process sessions."""

    def __init__(
        self, checkpoint: Path, artifacts: Path, device: str = "cpu", threads: int = 2, max_sessions: int = 20000
    ):
        import torch
        from transformers import AutoModelForCausalLM

        if device == "cpu":
            torch.set_num_threads(threads)
        self.torch = torch
        self.device = device
        dtype = torch.float16 if device.startswith("cuda") else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=dtype).to(device).eval()
        manifest = Manifest.load(artifacts)
        self.tokenizer = TextTokenizer(artifacts)
        self.prompts = PromptBuilder(self.tokenizer, manifest.system_prompt, 6, manifest.context_window)
        self.stop_ids = set(manifest.eos_token_ids)
        self.end_id = manifest.end_of_turn_id
        self.pad_id = min(self.stop_ids)
        self._sessions: OrderedDict[str, Conversation] = OrderedDict()
        self._max_sessions = max_sessions
        self._lock = threading.Lock()

    def job(self, payload: dict) -> Job:
        text = payload.get("text")
        if not isinstance(text, str) or not text.strip():
            raise ValueError("text: empty message")
        session_id = payload.get("session_id") or None
        with self._lock:
            history = self._sessions.get(session_id) if session_id else None
        max_new = int(payload.get("max_new_tokens") or 96)
        return Job(
            self.prompts.build(history, text, max_new), session_id, IncrementalDetokenizer(self.tokenizer.decode)
        )

    def steps(self, jobs: list[Job]):
        """Run ``generate`` on the batch; yield after every step with the jobs' new tokens applied.

        Prompts are left-padded; a row is done at an end-of-turn token or its own token budget
        (``generate`` itself runs until every row is done)."""
        torch = self.torch
        from transformers import StoppingCriteria, StoppingCriteriaList
        from transformers.generation.streamers import BaseStreamer

        width = max(len(j.prompt.ids) for j in jobs)
        ids = torch.tensor([[self.pad_id] * (width - len(j.prompt.ids)) + j.prompt.ids for j in jobs])
        mask = torch.tensor([[0] * (width - len(j.prompt.ids)) + [1] * len(j.prompt.ids) for j in jobs])
        steps: queue.Queue = queue.Queue()

        class Streamer(BaseStreamer):
            first = True

            def put(self, value):
                if self.first:  # generate() hands the prompt over first
                    self.first = False
                    return
                steps.put(value.reshape(-1).tolist())

            def end(self):
                steps.put(None)

        class Cancelled(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                stop = all(j.cancelled.is_set() for j in jobs)
                return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)

        def run():
            try:
                with torch.inference_mode():
                    self.model.generate(
                        input_ids=ids.to(self.device),
                        attention_mask=mask.to(self.device),
                        do_sample=False,
                        max_new_tokens=max(j.prompt.max_new_tokens for j in jobs),
                        eos_token_id=sorted(self.stop_ids),
                        pad_token_id=self.pad_id,
                        streamer=Streamer(),
                        stopping_criteria=StoppingCriteriaList([Cancelled()]),
                    )
            except Exception as e:  # surface it to the consumer
                steps.put(e)
                steps.put(None)

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        while (tokens := steps.get()) is not None:
            if isinstance(tokens, Exception):
                raise tokens
            for job, token in zip(jobs, tokens):
                if job.done:
                    job.tokens.append(-1)  # a marker: nothing new for this row
                    continue
                job.tokens.append(token)
                job.done = token in self.stop_ids or len(job.tokens) >= job.prompt.max_new_tokens
            yield
        worker.join()
        for job in jobs:
            job.done = True

    def delta(self, job: Job) -> str:
        token = job.tokens[-1] if job.tokens else -1
        if token < 0:
            return ""
        text = job.detok.add([] if token in self.stop_ids else [token])
        return text + (job.detok.flush() if job.done else "")

    def finish(self, job: Job) -> dict:
        generated = [t for t in job.tokens if t >= 0]
        if job.session_id:
            conversation = self.prompts.after_answer(job.prompt, generated, job.detok.text, self.end_id)
            with self._lock:
                self._sessions[job.session_id] = conversation
                self._sessions.move_to_end(job.session_id)
                while len(self._sessions) > self._max_sessions:
                    self._sessions.popitem(last=False)
        return {
            "prompt_tokens": len(job.prompt.ids),
            "reused_tokens": 0,
            "generated_tokens": len(generated),
            "route": "peer",
            "ttft_ms": None,
            "fallback": False,
            "session": "memory",
        }


def _line(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


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
                            yield _line({"text": text})
                    yield _line({"stats": model.finish(job)})
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
        body = json.dumps(
            {"text": text, "session_id": session_id, "max_new_tokens": max_new_tokens, "priority": priority}
        )
        c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            try:
                c.request("POST", "/predict", body, {"Content-Type": "application/json"})
                r = c.getresponse()
            except TimeoutError:
                raise ChatError(f"no response within {self.timeout_s:.0f} s", "DEADLINE_EXCEEDED") from None
            except OSError as e:
                raise ChatError(str(e), "UNAVAILABLE") from None
            if r.status != 200:
                raise ChatError(r.read().decode(errors="replace")[:200], f"HTTP_{r.status}")
            while True:
                try:
                    line = r.readline()
                except TimeoutError:
                    raise ChatError(f"nothing streamed for {self.timeout_s:.0f} s", "DEADLINE_EXCEEDED") from None
                except (OSError, http.client.HTTPException) as e:
                    raise ChatError(f"stream broken: {e}", "UNAVAILABLE") from None
                if not line:
                    raise ChatError("stream ended without stats", "INTERNAL")
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
        finally:
            c.close()


def wait_ready(client: HttpChatClient, timeout: float = 120, proc=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.ready():
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"peer exited with code {proc.returncode}")
        time.sleep(0.3)
    raise TimeoutError(f"peer on :{client.port} not ready after {timeout:.0f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.perf.peers", description=__doc__.split("\n\n")[0])
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
        from switchboard.perf.litserve_peer import serve

        serve(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
