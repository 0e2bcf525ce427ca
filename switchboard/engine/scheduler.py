"""The generation loop: iteration-level batching on lanes, streaming callbacks.

Each iteration works on one *lane*, a running batch with its own KV cache: it admits waiting
sequences while there is room and prefills them together on top of their cached prefixes, or
else runs one decode step for the lane's rows. Finished rows leave between steps. Nothing here
knows Triton: results go to a ``Sink``.

The queue's lock, the worker threads and their wait for work are the batching loop's
(switchboard/common/loop.py), which the speech pool runs too: the engine is the loop's step (one
iteration of a lane), ``_Turns`` a thread's policy (which lane next, and when). What goes first,
which lane a priority uses, whether a row is free and when priority 2 holds back are the engine's
policy's (switchboard/engine/policy.py): the engine asks it under the loop's lock, passing
counts, and keeps its lanes, the decoder calls and the KV. One shared lane, or priority 1 in a
lane of its own whose iterations come first (``preempt_steps``).

An iteration is decided (``schedule``: which lane, which sequences join), run (``run``: the
decoder's one forward pass, behind the small ``Decoder`` protocol) and applied
(``update_from_output``: the new cache, a sampled token per row, finished rows out), so the
scheduling is tested with a scripted decoder and no model (tests/unit/test_scheduler.py).

With a ``prefill_budget`` (> 0) a forward pass prefills at most that many prompt positions
(rows x longest chunk, padding included). An admitted sequence takes its row at once but is
prefilled in chunks, each on top of its own cache of the chunks before (``reused``/``past``
advance); with its last chunk it joins the lane's running batch and gets its first token.
Short prompts share a pass while their chunks fit the budget together; a longer one goes
alone. While a lane has both running rows and prompts in prefill, its iterations alternate a
prefill pass and a decode step, so the rows already decoding keep streaming while a long prompt
is prefilled: their gap between tokens is one decode step plus one chunk, not the whole
prompt's prefill (a 400-token prompt is ~2 s at 0.5B on CPU). A priority-1 prompt that arrives
during a priority-2 prefill pass takes the next pass, not the one after the decode step. It is the "total length cap per
batch" of seed 001's batching fix, applied to prompt tokens. Budget 0 prefills whole prompts
at admission, before any decode step.

On a decoder that packs (engine/packing.py; ``pack``), a pass whose rows take different numbers
of tokens computes their tokens only, no padding: prompts prefilled together, rows verifying
drafts of different lengths (each draft whole), and *mixed passes*: a lane with running rows
prefills its prompts' chunks in their decode pass instead of between their steps (``_mixed``),
so a row gets a token every pass and a prompt never waits for a decode step.

With ``lane_threads`` 2 the two lanes run on threads of their own instead of taking turns,
priority 2's ``normal_nice`` nice levels below the process (Linux, per thread; with ONNX
Runtime at one intra-op thread the model runs on the calling thread, so this covers priority
2's model time too). The operating system then gives the CPU to priority 1's lane first, and on
an idle core the two lanes overlap. A priority-1 token no longer waits for any priority-2
step, only for the cores the rest of the server leaves it, and priority 2 gets more done
(docs/reliability.md, "Priority 1 under a burst"). Under an overload priority 2's lane also
waits while priority 1 has work (``hold_back_ms``; the policy's ``hold_back`` says why).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import operator
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from switchboard.common.loop import Loop, Sink, Worker
from switchboard.engine import packing
from switchboard.engine.batch import KVBatch, prefill_inputs
from switchboard.engine.decoder import Decoder
from switchboard.engine.draft import RowDrafts, Speculation
from switchboard.engine.policy import NORMAL, URGENT, Policy, make_policy
from switchboard.engine.sampling import Counts, penalize, sample
from switchboard.wire import MAX_TOP_LOGPROBS, FinishReason

log = logging.getLogger(__name__)


@dataclass
class GenerationRequest:
    prompt: list[int]
    max_new_tokens: int
    reused: int = 0  # prompt[:reused] is covered by ``past``
    past: np.ndarray | None = None  # [layers, 2, H, reused, D]
    temperature: float = 0.0
    top_p: float = 1.0
    priority: int = 2
    seed: int | None = None
    return_cache: bool = False
    constraint: Constraint | None = None  # what the answer must match (artifact/grammar.py); None: free
    # -1: none; 0-5: each token's log-probability and that many of the likeliest alternatives (Sink.emit)
    logprobs: int = -1
    # OpenAI's repetition control, -2 to 2, over the tokens this row generated (sampling.penalize)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


class Constraint(Protocol):
    """A row's grammar (``switchboard.artifact.grammar.RowConstraint``)."""

    def mask(self, logits: np.ndarray) -> bool: ...  # forbid in place; False: nothing allowed
    # the token to write instead of the sampled one, ``budget`` tokens left with it: itself, or the
    # next of the shortest way to finish the answer when the budget leaves room for no more
    def choose(self, token: int, budget: int) -> int: ...
    def accept(self, token: int) -> bool: ...
    @property
    def finished(self) -> bool: ...  # complete, or broken: the row ends
    @property
    def cut(self) -> bool: ...  # the budget ended it: the engine wrote its finishing (finish_reason length)


@dataclass
class GenerationResult:
    tokens: list[int]
    reason: FinishReason  # stop | length | cancelled
    cache: np.ndarray | None  # [layers, 2, H, T, D] for prompt + tokens[:-1]
    queue_ms: float
    prefill_ms: float
    batch_size_at_admission: int
    engine_ms: float = 0.0  # from submission to the last token
    drafted: int = 0  # tokens drafted for it and verified by the model (speculation)
    accepted: int = 0  # ... and kept: its tokens took that many fewer forward passes


# A sequence's ``Sink`` (switchboard/common/loop.py) hears ``emit(ids, logprobs)``, each token
# as it is chosen (``logprobs``: None, or for a request with ``logprobs`` >= 0 one entry a token:
# its log-probability and [(id, log-probability), ...] of the likeliest alternatives), then
# ``finish(GenerationResult)`` or ``fail(error)``.


@dataclass
class _Lane:
    name: str
    waiting: list[tuple[tuple, int, "_Sequence"]] = field(default_factory=list)  # heap: rank, arrival order
    running: list["_Sequence"] = field(default_factory=list)
    batch: KVBatch | None = None
    # Admitted (a row taken), prompt not fully prefilled yet: in rank order.
    prefilling: list["_Sequence"] = field(default_factory=list)
    prefilled: bool = False  # the last iteration was a prefill pass (with a budget, a decode step is next)
    urgent_prefilled: bool = False  # ... and it prefilled a priority-1 prompt


@dataclass
class _Sequence:
    request: GenerationRequest
    sink: Sink
    arrival: float
    rng: np.random.Generator
    order: int  # arrival order
    rank: tuple  # the policy's sort key: lower goes first
    tokens: list[int] = field(default_factory=list)
    queue_ms: float = 0.0
    prefill_started: float | None = None  # perf_counter() when its first chunk began
    prefill_ms: float = 0.0
    admitted_with: int = 0
    broken: bool = False  # its sink raised: dropped without a result
    limit: int = 0  # the most tokens it may generate: max_new_tokens, or fewer where the context window ends first
    counts: Counts | None = None  # with penalties: its generated tokens, counted
    drafts: RowDrafts | None = None  # with speculation, once it decodes: its text, indexed
    acceptance: float = 0.0  # with speculation: its recent drafted tokens' acceptance (DraftLength)
    drafted: int = 0
    accepted: int = 0


_by_rank = operator.attrgetter("rank")


def token_logprobs(logits: np.ndarray, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    """``token``'s log-probability under ``logits`` (as masked for sampling, before temperature:
    what OpenAI's ``logprobs`` report) and the ``top`` likeliest tokens' (at most 5)."""
    z = logits.astype(np.float64)
    finite = np.isfinite(z)
    m = z[finite].max() if finite.any() else 0.0
    lse = m + np.log(np.exp(z[finite] - m).sum()) if finite.any() else 0.0
    top = min(max(top, 0), MAX_TOP_LOGPROBS)
    best = []
    if top:
        ids = np.argpartition(-z, top - 1)[:top] if z.shape[0] > top else np.arange(z.shape[0])
        ids = ids[np.argsort(-z[ids], kind="stable")]
        best = [(int(i), float(z[i] - lse)) for i in ids if np.isfinite(z[i])]
    return float(z[token] - lse), best


@dataclass
class StepPlan:
    """One iteration, decided: ``admitted`` took rows on ``lane``; then one prefill pass of
    ``chunks`` (on top of each one's cached prefix), or else (``decode``) one decode step for
    the lane's running rows, or nothing."""

    lane: _Lane
    admitted: list[_Sequence]
    decode: bool
    # Taken from the head of lane.prefilling: each sequence and the prompt length its cache
    # covers after this pass (its whole prompt on its last chunk).
    chunks: list[tuple[_Sequence, int]] = field(default_factory=list)
    # With speculation, a decode step that verifies drafts: each running row's draft (maybe empty).
    drafts: list[tuple[int, ...]] = field(default_factory=list)


@dataclass
class StepOutput:
    """The decoder's answer to a plan: each row's next-token logits and the lane's new cache."""

    last_logits: np.ndarray  # [rows, vocab]; a step verifying drafts: [rows, 1 + longest draft, vocab]
    batch: KVBatch
    padded: int  # tokens (prefill) or cache columns (decode) the step computed, padding included
    started: float  # perf_counter() when the forward pass began


STAT_KEYS = (
    "prefill_batches",
    "prefill_tokens",
    "prefill_padded_tokens",
    "prefill_chunks",
    "prefill_s",
    "decode_steps",
    "decode_columns",
    "decode_padded_columns",
    "decode_s",
    "finished_stop",
    "finished_length",
    "finished_cancelled",
    "busy_s",
    "held_back_s",
    "verify_steps",
    "drafted_tokens",
    "accepted_tokens",
    "compactions",
    "packed_passes",
    "mixed_passes",
)


class Engine:
    def __init__(
        self,
        decoder: Decoder,
        max_batch: int,
        max_waiting: int,
        stop_ids: set[int],
        priority_slots: int = 0,
        preempt_steps: int = 0,
        priority_overflow: int = 0,
        lane_threads: int = 1,
        normal_nice: int = 19,
        hold_back_ms: float = 0.0,
        prefill_budget: int = 0,
        policy: Policy | None = None,
        banned_ids: Iterable[int] = (),
        speculation: Speculation | None = None,
        pack: bool = True,
    ):
        """``policy`` replaces the one ``max_batch``, ``priority_slots``, ``preempt_steps``,
        ``priority_overflow`` and ``hold_back_ms`` name (``make_policy``). ``banned_ids``:
        tokens never chosen (``control_token_ids``: control characters). ``speculation``: draft
        tokens and verify them in the decode steps (the decoder must return every position's
        logits: ``forward(..., keep=n)``); None decodes a token a pass. ``pack``: where the
        decoder packs (``forward_packed``), a pass whose rows take different numbers of tokens
        (prompts, drafts) computes their tokens only, not the padded grid."""
        m = decoder.manifest
        self.decoder = decoder
        self.policy = policy or make_policy(max_batch, priority_slots, preempt_steps, priority_overflow, hold_back_ms)
        self.max_waiting = max_waiting
        self.stop_ids = frozenset(stop_ids)
        self.banned_ids = np.array(sorted(set(banned_ids) - self.stop_ids), np.int64)
        self._stop_array = np.array(sorted(self.stop_ids), np.int64)
        self.context_window = m.context_window
        self._shape = (m.num_layers, m.num_kv_heads, m.head_dim)
        self._order = itertools.count()
        self.lane_threads = 2 if self.policy.priority_lane and lane_threads >= 2 else 1
        self.normal_nice = max(0, min(normal_nice, 19))
        self.prefill_budget = max(0, prefill_budget)  # prompt positions per prefill pass (0: whole prompts)
        self.speculation = speculation
        self.packs = pack and getattr(decoder, "packs", False)
        self._normal_stepped = 0.0  # when priority 2's lane thread last finished a step
        self._urgent, self._normal = _Lane(URGENT), _Lane(NORMAL)  # priority 1's own (PriorityLane); the rest
        self._rows = 0  # sequences admitted and not yet retired, both lanes
        self._urgent_streak = 0  # priority-1 iterations in a row
        # the loop's lock guards the lanes' waiting heaps and _rows
        self.loop = Loop(self, self._workers(), clock=time.perf_counter)
        self._stats_lock = threading.Lock()
        self.stats = Counter({k: 0 for k in STAT_KEYS})
        self.batch_sizes: Counter = Counter()  # decode batch size -> steps

    # -- submission (any thread) -------------------------------------------------------
    def validate(self, req: GenerationRequest) -> None:
        if not req.prompt:
            raise ValueError("empty prompt")
        if not 0 <= req.reused < len(req.prompt):
            raise ValueError(f"reused={req.reused} must be below the prompt length {len(req.prompt)}")
        if len(req.prompt) >= self.context_window:
            raise ValueError(
                f"prompt of {len(req.prompt)} tokens does not fit the context window {self.context_window}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(req, name)
            if not (isinstance(value, (int, float)) and -2.0 <= value <= 2.0):  # NaN fails too
                raise ValueError(f"{name}: {value} is outside [-2, 2]")
        if req.reused:
            layers, heads, dim = self._shape
            want = (layers, 2, heads, req.reused, dim)
            if req.past is None or tuple(req.past.shape) != want:
                raise ValueError(f"past KV shape {None if req.past is None else req.past.shape} != {want}")

    def has_room(self) -> bool:
        with self.loop.cond:
            return self._queued() < self.max_waiting

    def wait_for_room(self, timeout: float) -> bool:
        return self.loop.wait_for(lambda: self._queued() < self.max_waiting, timeout)

    def submit(self, req: GenerationRequest, sink: Sink) -> None:
        self.validate(req)

        def add() -> None:
            order = next(self._order)
            rank = self.policy.rank(req.priority, order)
            seq = _Sequence(req, sink, time.perf_counter(), np.random.default_rng(req.seed), order, rank)
            # the n-th token is written at position len(prompt) + n - 1 (_finished)
            seq.limit = min(req.max_new_tokens, self.context_window - len(req.prompt) + 1)
            if req.presence_penalty or req.frequency_penalty:
                seq.counts = Counts()
            if self.speculation is not None:
                seq.acceptance = self.speculation.length.prior
            heapq.heappush(self._lane(req.priority).waiting, (rank, order, seq))

        self.loop.submit(add)

    def waiting(self) -> int:
        with self.loop.cond:
            return self._queued()

    def snapshot(self) -> tuple[dict, dict, int, int]:
        """Counters, decode steps per batch size, waiting and running sequences (any thread)."""
        with self._stats_lock:
            stats, sizes = dict(self.stats), dict(self.batch_sizes)
        with self.loop.cond:
            return stats, sizes, self._queued(), self.running()

    def running(self) -> int:
        """Sequences decoding or part-way through their prompt's prefill chunks (any thread).
        Those in the forward pass under way count once it is applied."""
        return sum(len(x.running) + len(x.prefilling) for x in (self._urgent, self._normal))

    def _queued(self) -> int:
        return len(self._urgent.waiting) + len(self._normal.waiting)

    def _lane(self, priority: int) -> _Lane:
        return self._urgent if self.policy.lane(priority) == URGENT else self._normal

    def _has_row(self, lane: _Lane, admitting: int = 0) -> bool:
        """Whether the sequence at the head of ``lane`` may take a row (under _cv), ``admitting``
        more already taken by this admission (and counted in _rows)."""
        return self.policy.may_admit(
            lane.name,
            lane.waiting[0][2].request.priority,
            len(lane.running) + len(lane.prefilling) + admitting,
            self._rows,
        )

    def _ready(self, lane: _Lane) -> bool:
        """Whether an iteration on ``lane`` has work: rows to decode or prefill, or one to admit (under _cv)."""
        return bool(lane.running or lane.prefilling) or (bool(lane.waiting) and self._has_row(lane))

    def _count(self, counts: dict, decode_size: int = 0) -> None:
        with self._stats_lock:
            self.stats.update(counts)
            if decode_size:
                self.batch_sizes[decode_size] += 1

    # -- the loop (switchboard/common/loop.py): this engine is its step --------------------------
    def _workers(self) -> list[Worker]:
        if self.lane_threads == 2:
            return [
                Worker(f"switchboard-engine-{URGENT}", _Turns(self, URGENT)),
                Worker(f"switchboard-engine-{NORMAL}", _Turns(self, NORMAL), self.normal_nice),
            ]
        return [Worker("switchboard-engine", _Turns(self, None))]

    def start(self) -> None:
        self.loop.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.loop.close(timeout)
        for lane in (self._urgent, self._normal):
            for seq in lane.running + lane.prefilling + [s for _, _, s in lane.waiting]:
                seq.sink.fail(RuntimeError("engine stopped"))
        self._urgent, self._normal, self._rows = _Lane(URGENT), _Lane(NORMAL), 0

    def _lanes(self, name: str | None) -> list[_Lane]:
        """The lanes a thread serves: the one named, or both (one thread taking turns)."""
        if name is None:
            return [self._urgent, self._normal]
        return [self._urgent if name == URGENT else self._normal]

    def failed(self, lane: _Lane, error: Exception) -> None:
        """A step raised (a runtime failure): it fails the running rows of the lanes its thread
        serves, not the engine."""
        for x in [lane] if self.lane_threads == 2 else self._lanes(None):
            self._fail(x.running, error)
            x.running, x.batch = [], None

    def _hold_back(self, lanes: list[_Lane], now: float) -> float:
        """Seconds priority 2's own lane thread should still wait for priority 1 (under the lock),
        0 or less to go (the policy's ``hold_back``); a thread that runs both never waits."""
        if lanes != [self._normal]:
            return 0.0
        urgent = self._urgent
        busy = bool(urgent.running or urgent.prefilling or urgent.waiting)
        return self.policy.hold_back(len(self._normal.waiting), busy, self._normal_stepped, now)

    def _fail(self, seqs: list[_Sequence], error: Exception) -> None:
        """Answer ``seqs`` with ``error`` and free their rows."""
        for seq in seqs:
            seq.sink.fail(error)
        self._free_rows(len(seqs))

    def _free_rows(self, n: int) -> None:
        with self.loop.cond:
            self._rows -= n
        self.loop.notify()  # rows free for the other lane

    # -- one iteration: plan it, run the decoder, apply its output ----------------------------
    def step(self, lane: _Lane | None = None) -> None:
        """One iteration on one lane (``_turn``'s when None): admit, then a prefill pass or a decode step."""
        t0 = time.perf_counter()
        try:
            plan = self.schedule(lane)
            try:
                output = self.run(plan)
            except Exception as e:
                if plan.chunks:  # in no lane's lists during the pass: nobody else would answer them
                    self._fail([seq for seq, _ in plan.chunks], e)
                raise
            self.update_from_output(plan, output)
            self._count({"busy_s": time.perf_counter() - t0})
        finally:
            if lane is self._normal:
                self._normal_stepped = time.perf_counter()

    def schedule(self, lane: _Lane | None = None) -> StepPlan:
        """Decide the iteration: which lane, which waiting sequences take rows on it, and whether
        it prefills (which chunks) or decodes. On a decoder that packs, a lane with rows to decode
        prefills its chunks in the same pass (a mixed pass). Otherwise, with a budget, a lane that
        has rows to decode decodes after each prefill pass; without one, prefills go first."""
        lane = lane if lane is not None else self._turn()
        admitted = self._admit(lane)
        chunks = []
        mixed = self.packs and bool(lane.running)  # prompts' chunks ride in the decode pass
        if lane.prefilling and (mixed or not (self.prefill_budget and lane.running and self._decode_first(lane))):
            chunks = self._take_chunks(lane)
        lane.prefilled = bool(chunks)
        lane.urgent_prefilled = any(seq.request.priority <= 1 for seq, _ in chunks)
        decode = bool(lane.running) and (mixed or not chunks)
        drafts = self._draft(lane) if decode and not chunks and self.speculation is not None else []
        return StepPlan(lane, admitted, decode=decode, chunks=chunks, drafts=drafts)

    def _draft(self, lane: _Lane) -> list[tuple[int, ...]]:
        """Each running row's draft: as long as its recent acceptance makes worth it
        (``DraftLength``), never past its token limit or the context window; [] when no row has one."""
        spec, out, rows = self.speculation, [], len(lane.running)
        # packed: every row's length weighed together (a row's draft costs its own tokens); padded:
        # each row's best, then one width for the pass below
        packed = spec.length.packed([seq.acceptance for seq in lane.running]) if self.packs else None
        for row, seq in enumerate(lane.running):
            room = min(seq.limit - len(seq.tokens), self.context_window - int(lane.batch.next_pos[row])) - 1
            k = min(packed[row] if packed else spec.length.best(seq.acceptance, rows), room)
            if k <= 0:
                out.append(())
                continue
            if seq.drafts is None:
                seq.drafts = spec.drafter.start(seq.request.prompt + seq.tokens)
            out.append(seq.drafts.propose(k).tokens)
        if self.packs:  # each row's draft costs its own tokens only: every one verified whole
            return out if any(out) else []
        # padded: one width for the pass, the drafts cut to what the whole batch gains from them
        width = spec.length.width([(len(d), seq.acceptance) for d, seq in zip(out, lane.running)])
        return [d[:width] for d in out] if width else []

    @staticmethod
    def _decode_first(lane: _Lane) -> bool:
        """With a budget, whether the lane's running rows decode before the next prefill pass:
        after every pass, except that a priority-1 prompt (prefilling is in rank order) goes
        straight after a pass of priority 2's, not a decode step later (it alternates with the
        decode steps from its own first chunk on)."""
        if not lane.prefilled:
            return False
        return lane.prefilling[0].request.priority > 1 or lane.urgent_prefilled

    def _take_chunks(self, lane: _Lane) -> list[tuple[_Sequence, int]]:
        """Take the head of ``lane.prefilling`` that fits one pass: rows x longest chunk within
        the budget (a prompt longer than the budget goes alone, a budget's worth at a time).
        A sequence whose client left is dropped here, before its next chunk."""
        chunks: list[tuple[_Sequence, int]] = []
        longest = 0
        while lane.prefilling:
            seq = lane.prefilling[0]
            if self._drop_cancelled(seq):
                lane.prefilling.pop(0)
                continue
            n = len(seq.request.prompt) - seq.request.reused
            if self.prefill_budget:
                n = min(n, self.prefill_budget)
                if chunks and (len(chunks) + 1) * max(longest, n) > self.prefill_budget:
                    break
            chunks.append((lane.prefilling.pop(0), seq.request.reused + n))
            longest = max(longest, n)
        return chunks

    def run(self, plan: StepPlan) -> StepOutput | None:
        """The decoder's forward pass for ``plan``: the only call into the model."""
        if plan.chunks and plan.decode:
            return self._mixed(plan)
        if plan.chunks:
            t0 = time.perf_counter()
            reqs = [(s.request, end) for s, end in plan.chunks]
            layers, heads, dim = self._shape
            ids, mask, pos, past, next_pos = prefill_inputs(
                [r.prompt[:end] for r, end in reqs], [r.reused for r, _ in reqs], [r.past for r, _ in reqs],
                layers, heads, dim, self.decoder.dtype,
            )  # fmt: skip
            logits, present, computed = self._forward(ids, mask, pos, past)
            return StepOutput(logits[:, -1, :], KVBatch(present, mask, next_pos), computed, t0)
        if plan.drafts:
            return self._verify(plan)
        if plan.decode:
            b = plan.lane.batch
            tokens = np.asarray([[s.tokens[-1]] for s in plan.lane.running], np.int64)
            mask = np.concatenate([b.mask, np.ones((b.size, 1), b.mask.dtype)], axis=1)
            t0 = time.perf_counter()
            logits, present = self.decoder.forward(tokens, mask, b.next_pos[:, None], b.kv)
            return StepOutput(logits[:, -1, :], KVBatch(present, mask, b.next_pos + 1), int(mask.size), t0)
        return None

    def _verify(self, plan: StepPlan) -> StepOutput:
        """One decode step that also runs each row's draft: a row's last token then its draft,
        on its right (a shorter draft has masked columns on its left, as a row that joined
        later has), and the logits of every position."""
        b, seqs = plan.lane.batch, plan.lane.running
        n = 1 + max(len(d) for d in plan.drafts)
        ids = np.zeros((b.size, n), np.int64)
        new = np.zeros((b.size, n), b.mask.dtype)
        pos = np.repeat(b.next_pos[:, None], n, axis=1)
        for row, (seq, draft) in enumerate(zip(seqs, plan.drafts)):
            k = len(draft)
            ids[row, n - 1 - k :] = (seq.tokens[-1], *draft)
            new[row, n - 1 - k :] = 1
            pos[row, n - 1 - k :] += np.arange(k + 1)
        mask = np.concatenate([b.mask, new], axis=1)
        t0 = time.perf_counter()
        logits, present, _ = self._forward(ids, mask, pos, b.kv, keep=n)
        return StepOutput(logits, KVBatch(present, mask, b.next_pos.copy()), int(mask.size), t0)

    def _mixed(self, plan: StepPlan) -> StepOutput:
        """One packed pass: each running row's next token, and each chunk on top of its cached
        prefix in a row after them (its prefix joins the lane's cache for the pass)."""
        lane, (layers, heads, dim) = plan.lane, self._shape
        reqs = [(s.request, end) for s, end in plan.chunks]
        ids, mask, _, past, _ = prefill_inputs(
            [r.prompt[:end] for r, end in reqs], [r.reused for r, _ in reqs], [r.past for r, _ in reqs],
            layers, heads, dim, self.decoder.dtype,
        )  # fmt: skip
        prefixes = KVBatch(past, mask[:, : mask.shape[1] - ids.shape[1]], np.array([r.reused for r, _ in reqs]))
        grid = lane.batch.merge(prefixes)
        new = [[s.tokens[-1]] for s in lane.running] + [r.prompt[r.reused : end] for r, end in reqs]
        packed = packing.pack(new, grid.next_pos, grid.mask)
        t0 = time.perf_counter()
        logits, present = self.decoder.forward_packed(packed, grid.kv)
        self._count({"packed_passes": 1})
        next_pos = np.concatenate([lane.batch.next_pos + 1, [end for _, end in reqs]]).astype(np.int64)
        return StepOutput(logits, KVBatch(present, packed.attention_mask, next_pos), packed.tokens, t0)

    def _forward(self, ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, past, keep: int = 1):
        """The decoder's pass over padded inputs: packed (engine/packing.py) where the rows' new
        tokens differ in number and the decoder packs, so no padded slot is computed. Returns the
        logits of each row's last ``keep`` positions [B, keep, V], the grown cache and the tokens
        computed."""
        packed = packing.from_padded(ids, mask, pos, keep) if self.packs else None
        if packed is None:
            logits, present = self.decoder.forward(ids, mask, pos, past, **({"keep": keep} if keep != 1 else {}))
            return logits, present, int(ids.size)
        logits, present = self.decoder.forward_packed(packed, past)
        self._count({"packed_passes": 1})
        return packing.spread(logits, packed, keep), present, packed.tokens

    def update_from_output(self, plan: StepPlan, output: StepOutput | None) -> None:
        """Apply the forward pass: the lane's new cache, a token for each row, finished rows out."""
        lane = plan.lane
        if plan.chunks and plan.decode:
            rows = len(lane.running)
            mask = output.batch.mask[:rows]
            self._count(
                {
                    "decode_steps": 1,
                    "mixed_passes": 1,
                    "decode_padded_columns": int(mask.size - mask.sum()),
                    "decode_columns": int(mask.size),
                },
                decode_size=rows,
            )
            self._emit(lane.running, output.last_logits[:rows])
            self._apply_chunks(plan, output, first=rows)
        elif plan.chunks:
            self._apply_chunks(plan, output)
        elif plan.decode:
            size, mask = output.batch.size, output.batch.mask
            lane.batch = output.batch
            self._count(
                {
                    "decode_steps": 1,
                    "decode_s": time.perf_counter() - output.started,
                    "decode_padded_columns": int(mask.size - mask.sum()),
                    "decode_columns": output.padded,
                },
                decode_size=size,
            )
            if plan.drafts:
                self._apply_drafts(plan, output)
            else:
                self._emit(lane.running, output.last_logits)
                if self.speculation is not None:  # no row had a draft: each drifts back to trying
                    for seq in lane.running:
                        seq.acceptance = self.speculation.length.idle(seq.acceptance)
        self._retire(lane)

    def _apply_drafts(self, plan: StepPlan, output: StepOutput) -> None:
        """A verifying step applied: each row keeps the tokens its draft had right and the
        model's own next one; the rejected tokens' cache columns are masked (and the cache
        compacted once such holes outnumber the real columns)."""
        lane, spec = plan.lane, self.speculation
        used = self._emit(lane.running, output.last_logits, plan.drafts)
        batch, width = output.batch, output.batch.width
        drafted = accepted = 0
        for row, (seq, draft, n) in enumerate(zip(lane.running, plan.drafts, used)):
            k, kept = len(draft), n - 1  # the draft tokens whose cache stays: those before its last token
            batch.mask[row, width - (k - kept) :] = 0
            batch.next_pos[row] += 1 + kept
            if k:
                seq.acceptance = spec.length.update(seq.acceptance, k, kept)
                seq.drafted, seq.accepted = seq.drafted + k, seq.accepted + kept
                drafted, accepted = drafted + k, accepted + kept
            else:
                seq.acceptance = spec.length.idle(seq.acceptance)
        if batch.holes() > batch.mask.sum():
            batch = batch.compacted()
            self._count({"compactions": 1})
        lane.batch = batch
        self._count({"verify_steps": 1, "drafted_tokens": drafted, "accepted_tokens": accepted})

    def _apply_chunks(self, plan: StepPlan, output: StepOutput, first: int = 0) -> None:
        """A prefill pass applied: a sequence with more prompt to go keeps its real columns as
        its own cache for the next chunk; one whose prompt is done joins the running batch and
        gets its first token. ``first``: the pass's row of the first chunk (a mixed pass: the
        lane's running rows come first, and its cache is the lane's new one)."""
        lane, now = plan.lane, time.perf_counter()
        done = [i for i, (seq, end) in enumerate(plan.chunks) if end == len(seq.request.prompt)]
        self._count(
            {
                "prefill_chunks": 1,
                "prefill_batches": int(bool(done)),  # groups that joined the running batch together
                "prefill_s": now - output.started,
                "prefill_padded_tokens": output.padded - first,  # a mixed pass's decode rows left out
                "prefill_tokens": sum(end - seq.request.reused for seq, end in plan.chunks),
            }
        )
        more = []
        for row, (seq, end) in enumerate(plan.chunks):
            if seq.prefill_started is None:
                seq.prefill_started = output.started
            if end < len(seq.request.prompt):
                seq.request.past, seq.request.reused = output.batch.row_cache(first + row, self.decoder.dtype), end
                more.append(seq)
        if more:
            lane.prefilling.extend(more)
            lane.prefilling.sort(key=_by_rank)
        if first:  # the running rows and the chunks that finished stay in the lane's cache
            keep = list(range(first)) + [first + i for i in done]
            lane.batch = output.batch if len(keep) == output.batch.size else output.batch.select(keep)
        if not done:
            return
        joined = [plan.chunks[i][0] for i in done]
        for seq in joined:
            seq.prefill_ms = (now - seq.prefill_started) * 1000
            seq.admitted_with = len(lane.running) + len(joined)
            seq.request.past = None  # the batch owns the cache now
        if not first:
            batch = output.batch if len(done) == len(plan.chunks) else output.batch.select(done)
            lane.batch = batch if lane.batch is None else lane.batch.merge(batch)
        lane.running.extend(joined)
        self._emit(joined, output.last_logits[[first + i for i in done]])

    def _turn(self) -> _Lane:
        """The lane this iteration works on, when one thread runs both (the policy's ``turn``)."""
        if not self.policy.priority_lane:
            return self._normal
        with self.loop.cond:
            urgent = self._ready(self._urgent)
            normal = bool(self._normal.running or self._normal.prefilling or self._normal.waiting)
        lane, self._urgent_streak = self.policy.turn(urgent, normal, self._urgent_streak)
        return self._urgent if lane == URGENT else self._normal

    def _admit(self, lane: _Lane) -> list[_Sequence]:
        """Waiting sequences that take a row on ``lane`` now; they join its ``prefilling``."""

        def pick() -> list[_Sequence]:
            out: list[_Sequence] = []
            while lane.waiting and self._has_row(lane, len(out)):
                out.append(heapq.heappop(lane.waiting)[2])
                self._rows += 1
            return out

        out = self.loop.join(pick)
        now = time.perf_counter()
        for seq in out:
            seq.queue_ms = (now - seq.arrival) * 1000
        lane.prefilling.extend(out)
        lane.prefilling.sort(key=_by_rank)
        return out

    def _drop_cancelled(self, seq: _Sequence) -> bool:
        if seq.sink.cancelled():
            self._free_rows(1)
            seq.sink.finish(GenerationResult([], FinishReason.CANCELLED, None, seq.queue_ms, 0.0, 0))
            return True
        return False

    def _emit(
        self, seqs: list[_Sequence], logits: np.ndarray, drafts: list[tuple[int, ...]] | None = None
    ) -> list[int]:
        """Choose and send each row's tokens; how many each row got.

        ``logits[i]`` is the next-token distribution of ``seqs[i]``; with ``drafts``, it is
        [positions, vocab], and row ``i``'s last ``1 + len(drafts[i])`` positions are the
        distributions after its last token and after each token of its draft. A row then takes
        tokens as decoding one at a time would: the choice after its last token, and while that
        choice is the draft's next token, the choice after it; the first choice that differs
        from the draft (or the one after the whole draft) is its last. So an answer is the same,
        token for token, with or without drafts, greedy or sampled with a seed (a choice draws
        from the row's generator once, drafted or not).

        Never chosen: a banned token (a control character), and a stop token as an answer's
        first token: an answer is never empty (OpenAI clients, AIPerf among them, take an answer
        without content for a failed request; vLLM's ``min_tokens=1``). A row with a
        ``constraint`` chooses only what its grammar allows, and ends once the grammar is
        complete; when the budget leaves room for no more than finishing it, the grammar writes
        its finishing instead (``Constraint.choose``). A row with presence or frequency penalties
        has them taken off its logits first (``penalize``)."""
        first = [i for i, seq in enumerate(seqs) if not seq.tokens]
        changed = any(seq.request.constraint is not None or seq.counts is not None for seq in seqs)
        if self.banned_ids.size or (first and self._stop_array.size) or changed:
            if not logits.flags.writeable:
                logits = logits.copy()
            logits[..., self.banned_ids] = -np.inf
            if first:  # rows fresh from their prefill, one position each; stop ids past the vocabulary left out
                logits[np.ix_(first, self._stop_array[self._stop_array < logits.shape[-1]])] = -np.inf
        used = []
        for i, seq in enumerate(seqs):
            draft = drafts[i] if drafts else ()
            positions = logits[i, logits.shape[1] - 1 - len(draft) :] if drafts else logits[i : i + 1]
            r = seq.request
            ids, probs = [], []
            for j, row in enumerate(positions):
                token = self._choose(seq, row)
                ids.append(token)
                if r.logprobs >= 0:
                    probs.append(token_logprobs(row, token, r.logprobs))
                if j == len(draft) or token != draft[j] or self._complete(seq):
                    break
            used.append(len(ids))
            if seq.drafts is not None:
                seq.drafts.accept(ids)
            try:
                seq.sink.emit(ids, probs if r.logprobs >= 0 else None)
            except Exception:  # a broken client must not stop the batch
                log.exception("sink failed; dropping the sequence")
                seq.broken = True
        return used

    def _choose(self, seq: _Sequence, logits: np.ndarray) -> int:
        """The row's next token from its (writable) ``logits``, added to its answer."""
        r = seq.request
        if seq.counts is not None:
            penalize(logits, seq.counts, r.presence_penalty, r.frequency_penalty)
        if r.constraint is not None and not r.constraint.mask(logits):
            token = int(self._stop_array[0]) if self._stop_array.size else 0  # nothing allowed: it ends
        else:
            token = sample(logits, r.temperature, r.top_p, seq.rng)
            if r.constraint is not None:
                token = r.constraint.choose(token, seq.limit - len(seq.tokens))
                if not r.constraint.accept(token):
                    log.warning("the grammar refused the token it allowed (%d); the answer ends", token)
        seq.tokens.append(token)
        if seq.counts is not None:
            seq.counts.add(token)
        return token

    def _complete(self, seq: _Sequence) -> bool:
        """Whether the row's answer can take no more tokens: a stop token, a grammar complete
        (or broken), or its limit reached."""
        constraint = seq.request.constraint
        return (
            seq.tokens[-1] in self.stop_ids
            or (constraint is not None and constraint.finished)
            or len(seq.tokens) >= seq.limit
        )

    def _finished(self, lane: _Lane, seq: _Sequence, row: int) -> FinishReason | None:
        constraint = seq.request.constraint
        # complete (a stop token, or a grammar after which nothing may follow); one the engine
        # finished because the budget ended it stays ``length``
        if (seq.tokens and seq.tokens[-1] in self.stop_ids) or (constraint is not None and constraint.finished):
            return FinishReason.LENGTH if constraint is not None and constraint.cut else FinishReason.STOP
        if len(seq.tokens) >= seq.request.max_new_tokens:
            return FinishReason.LENGTH
        if int(lane.batch.next_pos[row]) >= self.context_window:
            return FinishReason.LENGTH
        if seq.sink.cancelled():
            return FinishReason.CANCELLED
        return None

    def _retire(self, lane: _Lane) -> None:
        keep = []
        for row, seq in enumerate(lane.running):
            if seq.broken:
                continue  # dropped: its sink cannot take a result either
            reason = self._finished(lane, seq, row)
            if reason is None:
                keep.append(row)
                continue
            cache = lane.batch.row_cache(row, self.decoder.dtype) if seq.request.return_cache else None
            self._count({"finished_" + reason: 1})
            if seq.drafts is not None and reason == FinishReason.STOP:
                seq.drafts.finish()  # a whole answer: later rows may draft from it
            try:
                seq.sink.finish(
                    GenerationResult(
                        seq.tokens,
                        reason,
                        cache,
                        seq.queue_ms,
                        seq.prefill_ms,
                        seq.admitted_with,
                        (time.perf_counter() - seq.arrival) * 1000,
                        seq.drafted,
                        seq.accepted,
                    )
                )
            except Exception:
                log.exception("sink failed at finish")
        if len(keep) != len(lane.running):
            freed = len(lane.running) - len(keep)
            lane.running = [lane.running[i] for i in keep]
            lane.batch = lane.batch.select(keep) if keep else None
            self._free_rows(freed)  # after the update: a held-back priority 2 sees priority 1 done


class _Turns:
    """The loop's policy for one engine thread: the lane its next iteration works on, once a lane
    it serves (``name``'s, or both: None) has work it may do now and priority 2's own lane is not
    held back for priority 1 (the engine's policy decides both: switchboard/engine/policy.py)."""

    def __init__(self, engine: Engine, name: str | None):
        self.engine, self.name = engine, name
        self._due: float | None = None
        self._held_since: float | None = None

    def take(self, now: float) -> _Lane | None:
        e, self._due = self.engine, None
        lanes = e._lanes(self.name)
        if not any(e._ready(x) for x in lanes):
            return None
        hold = e._hold_back(lanes, now)
        if hold > 0:
            self._held_since = self._held_since or now
            self._due = now + hold
            return None
        if self._held_since is not None:
            e._count({"held_back_s": now - self._held_since})
            self._held_since = None
        return lanes[0] if self.name is not None else e._turn()

    def next_due(self, now: float) -> float | None:
        return self._due
