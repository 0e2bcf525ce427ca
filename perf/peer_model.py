"""The model both benchmark peers serve (see ``perf.peers``): a Hugging Face checkpoint
in PyTorch with ``chat``'s prompt building and in-process sessions, and the JSON lines they
answer with. Apart from ``peers`` so that ``litserve_peer``, which ``peers`` hands over to,
builds on it without importing ``peers`` back."""

from __future__ import annotations

import json
import queue
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from switchboard.artifact.manifest import Manifest
from switchboard.artifact.tokenizer import TextTokenizer
from switchboard.common.detok import IncrementalDetokenizer
from switchboard.serving.prompt import Conversation, Prompt, PromptBuilder


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
            self.prompts.build(history, text, max_new),
            session_id,
            IncrementalDetokenizer(self.tokenizer.decode, self.tokenizer.token_bytes),
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


class PromptSessions:
    """Conversations kept on the client's side for a server that keeps none (llama-server, vLLM):
    prompts built exactly as ``chat`` builds them (template, system prompt, sliding window), sent
    as token ids, and each answer stored once it ends."""

    def __init__(self, artifacts: Path):
        manifest = Manifest.load(artifacts)
        self.tokenizer = TextTokenizer(artifacts)
        self.prompts = PromptBuilder(self.tokenizer, manifest.system_prompt, 6, manifest.context_window)
        self.end_id = manifest.end_of_turn_id
        self.stop_ids = set(manifest.eos_token_ids)
        self._conversations: dict[str, Conversation] = {}
        self._lock = threading.Lock()

    def prompt(self, session_id: str | None, text: str, max_new_tokens: int) -> Prompt:
        with self._lock:
            history = self._conversations.get(session_id) if session_id else None
        return self.prompts.build(history, text, max_new_tokens)

    def answered(self, session_id: str | None, prompt: Prompt, ids: list[int], text: str) -> None:
        if session_id:
            conversation = self.prompts.after_answer(prompt, ids, text, self.end_id)
            with self._lock:
                self._conversations[session_id] = conversation


class SessionClient:
    """The load driver's client for a server that keeps no conversations (``perf.bench``):
    the events of ``ChatClient.chat`` (str deltas, then one ``ChatStats``), with ``sessions`` building
    each prompt as ``chat`` does. Subclasses stream one answer from their server."""

    def __init__(self, port: int, sessions: PromptSessions, timeout_s: float = 120.0):
        self.port, self.sessions, self.timeout_s = port, sessions, timeout_s

    @staticmethod
    def stats(prompt: Prompt, generated: int, reused: int, priority: int):
        from switchboard.wire import ChatStats

        return ChatStats(
            prompt_tokens=len(prompt.ids),
            reused_tokens=reused,
            generated_tokens=generated,
            dropped_turns=prompt.dropped_turns,
            priority=priority,
        )


def json_line(obj: dict) -> str:
    """One line of the peers' answer stream (JSON lines)."""
    return json.dumps(obj, ensure_ascii=False) + "\n"
