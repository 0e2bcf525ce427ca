"""The batching loop every pool runs: chat's generation and speech's recognition.

The mechanics are written once here; what differs per model is two small objects.

- The loop holds the waiting queue's lock: a condition that every submission, every row that
  leaves and ``close`` notify (``submit``, ``join``, ``notify``). Each worker thread waits under
  it until its policy has work that is due, then runs one step outside it. A step that raises
  is answered by the step's ``failed`` (its rows' sinks hear ``fail``), never by the loop
  stopping. Rows join a running batch between steps through ``join``, under the same lock, so a
  worker never takes rows another is handing out. ``close`` stops the workers and joins them.
- A ``Policy``, one per worker (workers may share one), asked under the lock: the work to run
  now, taken from its queue (``take``), else when to ask again (``next_due``: None until
  notified). Chat's priority lanes (switchboard/engine/scheduler.py's ``_Turns`` over
  engine/policy.py) and speech's length buckets (switchboard/asr/batcher.py, behind
  switchboard/asr/service.py's ``_Worker``, which first finishes the batch it began).
- A ``Step``: what one pass does for the work's rows (``step``) and how a pass that raised is
  answered (``failed``): the engine's iteration of a lane (plan, decoder pass, apply) and one
  decoding step of a speech batch (switchboard/asr/model.py's ``Decoding``).

Every row streams to a ``Sink``: ``emit`` its output as it comes, ``finish`` its result,
``fail`` with an error, and ``cancelled``, asked between steps, ends it early. The Triton glue's
sinks (switchboard/triton/engine_responses.py, asr_model.py) implement it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from switchboard.nice import lower_this_thread

log = logging.getLogger(__name__)

W = TypeVar("W")
T = TypeVar("T")


class Sink(Protocol):
    """Where one row's output goes, from the loop's worker threads."""

    def emit(self, *update) -> None: ...  # output as it comes: tokens (with logprobs), text
    def finish(self, result) -> None: ...  # the row's end, its result (a cancelled row's too)
    def fail(self, error: Exception) -> None: ...  # the row's end, failed
    def cancelled(self) -> bool: ...  # asked between steps: True ends the row


class Policy(Protocol[W]):
    """What a worker runs next; asked under the loop's lock, with the loop's clock."""

    def take(self, now: float) -> W | None:
        """The work to run now, taken from the queue; None when none is due yet."""
        ...

    def next_due(self, now: float) -> float | None:
        """When ``take`` may have work if nothing else happens; None: not until notified."""
        ...


class Step(Protocol[W]):
    """What the model does with work a policy gave."""

    def step(self, work: W) -> None: ...  # one pass for the work's rows
    def failed(self, work: W, error: Exception) -> None: ...  # the pass raised: answer its rows


@dataclass(frozen=True)
class Worker:
    """One worker thread: its name, the niceness it lowers itself by (Linux), its policy."""

    name: str
    policy: Policy
    nice: int = 0


class Loop(Generic[W]):
    def __init__(self, step: Step[W], workers: Sequence[Worker], clock: Callable[[], float] = time.monotonic):
        if not workers:
            raise ValueError("loop: at least one worker")
        self.step, self.workers, self.clock = step, list(workers), clock
        self.cond = threading.Condition()  # guards the policies' queues and whatever their users keep with them
        self._closed = False
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, args=(worker,), name=worker.name, daemon=True)
            for worker in self.workers
        ]
        for t in self._threads:
            t.start()

    def close(self, timeout: float = 5.0) -> bool:
        """Stop the workers after the step each is in, and join them (``timeout`` each); what is
        queued stays queued. Whether every worker stopped."""
        with self.cond:
            self._closed = True
            self.cond.notify_all()
        for t in self._threads:
            t.join(timeout)
        stopped = not any(t.is_alive() for t in self._threads)
        self._threads = []
        return stopped

    # -- any thread ---------------------------------------------------------------------------
    def submit(self, add: Callable[[], T]) -> T:
        """``add()`` under the lock (it queues rows), then the workers are woken."""
        with self.cond:
            out = add()
            self.cond.notify_all()
            return out

    def join(self, pick: Callable[[], list[T]]) -> list[T]:
        """Rows joining a running batch between steps: ``pick()`` under the lock takes them from
        the queue (room in it: waiters are woken); none once the loop is closed."""
        with self.cond:
            if self._closed:
                return []
            rows = pick()
            if rows:
                self.cond.notify_all()
            return rows

    def notify(self) -> None:
        """Wake the workers and waiters: rows left, room or work changed outside ``submit``."""
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """Wait until ``predicate()`` (asked under the lock) or the loop closes; False on timeout."""
        with self.cond:
            return self.cond.wait_for(lambda: predicate() or self._closed, timeout)

    def run(self, work: W) -> None:
        """One step of ``work`` on the calling thread; a step that raises is answered by ``failed``."""
        try:
            self.step.step(work)
        except Exception as e:  # a failed pass fails its rows, not the loop
            log.exception("%s: a step failed", threading.current_thread().name)
            self.step.failed(work, e)

    # -- the workers ------------------------------------------------------------------------
    def _work(self, worker: Worker) -> None:
        lower_this_thread(worker.nice, worker.name)
        while True:
            with self.cond:
                work = self._next(worker.policy)
            if work is None:
                return
            self.run(work)

    def _next(self, policy: Policy[W]) -> W | None:
        """The policy's next work, waiting until it is due (under the lock); None once closed."""
        while not self._closed:
            now = self.clock()
            work = policy.take(now)
            if work is not None:
                return work
            due = policy.next_due(now)
            self.cond.wait(None if due is None else max(0.0, due - self.clock()) + 1e-4)
        return None
