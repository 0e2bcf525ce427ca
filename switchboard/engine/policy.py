"""Scheduling policy: who goes first, in which lane, whether a row is free, when priority 2 waits.

The engine (switchboard/engine/scheduler.py) keeps the mechanics: the lanes' queues, its lock,
the threads, the decoder and the KV. At each decision it asks its policy, passing the counts and
times it read under its lock:

- ``rank``: the order waiting sequences are admitted and prefilling ones are prefilled in;
- ``lane``: the lane a priority waits and decodes in;
- ``may_admit``: whether the sequence at the head of a lane may take a row now;
- ``turn``: the lane an iteration works on when one thread runs both;
- ``hold_back``: how long priority 2's own lane thread should still wait for priority 1.

The answers depend on their arguments and the settings given at construction only: no state,
no lock, no clock, so each is tested alone (tests/unit/test_policy.py) and a new policy is one
class. ``make_policy`` picks the class a pool's settings name.

Priority 1 is the VIP class (a lower number goes first). Without preemption a VIP arriving at a
full batch would wait for a whole answer to finish, so priority 2 fills the engine's rows only up
to ``max_batch - priority_slots``.
"""

from __future__ import annotations

URGENT, NORMAL = "urgent", "normal"  # priority 1's own lane (PriorityLane); the lane of the rest


class Policy:
    """One lane for every priority, lowest priority number first, then arrival order. Priority 2
    takes rows up to ``max_batch - priority_slots``, counting priority 1's; priority 1 up to
    ``max_batch + priority_overflow``."""

    priority_lane = False  # priority 1 in a lane of its own: the engine then runs two
    priority_overflow = 0

    def __init__(self, max_batch: int, priority_slots: int = 0):
        self.max_batch = max_batch
        self.priority_slots = max(0, min(priority_slots, max_batch - 1))

    def rank(self, priority: int, order: int) -> tuple:
        """The sort key of a sequence of ``priority`` that arrived ``order``-th."""
        return priority, order

    def lane(self, priority: int) -> str:
        return NORMAL

    def may_admit(self, lane: str, priority: int, lane_rows: int, rows: int) -> bool:
        """Whether the sequence of ``priority`` at the head of ``lane`` may take a row while
        ``lane_rows`` rows are taken on that lane and ``rows`` on the engine's lanes together
        (admitted and not yet retired, this admission's included)."""
        if priority <= 1:
            return rows < self.max_batch + self.priority_overflow
        return rows < self.max_batch - self.priority_slots

    def turn(self, urgent_ready: bool, normal_busy: bool, streak: int) -> tuple[str, int]:
        """The lane of the next iteration when one thread runs both, and the new count of
        priority-1 iterations in a row (``streak`` the count so far)."""
        return NORMAL, 0

    def hold_back(self, normal_waiting: int, urgent_busy: bool, normal_stepped: float, now: float) -> float:
        """Seconds priority 2's own lane thread should still wait at ``now``, 0 or less to go:
        ``normal_waiting`` sequences wait for a row on its lane, priority 1 has work
        (``urgent_busy``), its last step ended at ``normal_stepped``."""
        return 0.0


class SharedBatch(Policy):
    """One shared lane in which priority 1 may take ``priority_overflow`` rows past
    ``max_batch``, so a VIP arriving at a full batch of priority 2 starts at the next step
    without keeping a row from priority 2 (a step at ``max_batch + 1`` rows costs little more
    than at ``max_batch`` on a compute-bound model). The arrangement for a compute-bound model
    (a large one on the CPU): every extra batch there streams all the weights once more per step,
    so a lane of its own makes priority 1's small batch cost nearly a full step
    (docs/benchmarks.md)."""

    def __init__(self, max_batch: int, priority_slots: int = 0, priority_overflow: int = 0):
        super().__init__(max_batch, priority_slots)
        self.priority_overflow = max(0, priority_overflow)


class PriorityLane(Policy):
    """Priority 1 decodes in a lane of its own. While it has work its iterations come first, and
    priority 2's lane gets one iteration after every ``preempt_steps`` of them, so priority 2 is
    slowed, never starved. A priority-1 token then costs a step at priority 1's own batch size,
    not one in a full priority-2 batch with priority-2 prefills in between (docs/reliability.md,
    "Priority 1 under a burst").

    Priority 1's lane fills up to ``max_batch`` rows whatever priority 2 holds, so several VIPs at
    once never wait for priority-2 answers to finish (they did at 5% priority 1 in a 5x burst:
    P95 up to 110 ms in the engine's queue with one reserved row); its rows count against priority
    2's, and the engine holds at most ``2 * max_batch - priority_slots`` sequences.

    With the lanes on threads of their own, priority 2's steps, though niced down, still cost
    priority 1: they share the process's GIL, and every priority-2 token costs sends and relays
    at the server's priority (this pool's sender, tritonserver, ``chat``). So when the engine
    cannot keep up with priority 2 (sequences wait for a row: an overload, whose excess ``chat``
    answers from the FAQ) priority 2 waits while priority 1 has work, and takes one step per
    ``hold_back_ms`` meanwhile so it is never starved (0: never waits). Below that load it decodes
    beside priority 1 on the cores priority 1 leaves."""

    priority_lane = True

    def __init__(self, max_batch: int, priority_slots: int = 0, preempt_steps: int = 1, hold_back_ms: float = 0.0):
        super().__init__(max_batch, priority_slots)
        self.preempt_steps = max(1, preempt_steps)
        self.hold_back_s = max(0.0, hold_back_ms) / 1000

    def lane(self, priority: int) -> str:
        return URGENT if priority <= 1 else NORMAL

    def may_admit(self, lane: str, priority: int, lane_rows: int, rows: int) -> bool:
        if lane == URGENT:
            return lane_rows < self.max_batch
        return super().may_admit(lane, priority, lane_rows, rows)

    def turn(self, urgent_ready: bool, normal_busy: bool, streak: int) -> tuple[str, int]:
        if not urgent_ready:  # nothing priority 1 could do this iteration
            return NORMAL, 0
        if streak >= self.preempt_steps and normal_busy:
            return NORMAL, 0
        return URGENT, streak + 1

    def hold_back(self, normal_waiting: int, urgent_busy: bool, normal_stepped: float, now: float) -> float:
        if not self.hold_back_s or not normal_waiting or not urgent_busy:
            return 0.0
        return normal_stepped + self.hold_back_s - now


def make_policy(
    max_batch: int,
    priority_slots: int = 0,
    preempt_steps: int = 0,
    priority_overflow: int = 0,
    hold_back_ms: float = 0.0,
) -> Policy:
    """The policy a pool's settings name: priority 1 in a lane of its own when ``preempt_steps``
    > 0 (``priority_lane`` on), else one shared lane. Each ignores the other's settings."""
    if preempt_steps > 0:
        return PriorityLane(max_batch, priority_slots, preempt_steps, hold_back_ms)
    return SharedBatch(max_batch, priority_slots, priority_overflow)
