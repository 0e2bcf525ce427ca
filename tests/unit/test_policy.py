"""The scheduling policy alone: counts and times in, decisions out; no engine, no threads.
(tests/unit/test_scheduler.py checks the engine asks it.)"""

from __future__ import annotations

import pytest

from switchboard.engine.policy import NORMAL, URGENT, PriorityLane, SharedBatch, make_policy


def test_priority_one_ranks_before_priority_two_and_each_in_arrival_order():
    policy = SharedBatch(max_batch=4)
    arrivals = [(2, 0), (1, 1), (2, 2), (1, 3), (2, 4)]  # (priority, arrival order)
    ranked = sorted(arrivals, key=lambda a: policy.rank(*a))
    assert ranked == [(1, 1), (1, 3), (2, 0), (2, 2), (2, 4)]
    assert PriorityLane(max_batch=4).rank(1, 9) < PriorityLane(max_batch=4).rank(2, 0)


def test_the_settings_name_the_policy():
    assert type(make_policy(8)) is SharedBatch
    shared = make_policy(8, priority_slots=1, priority_overflow=2, hold_back_ms=50)
    assert type(shared) is SharedBatch and shared.priority_overflow == 2 and not shared.priority_lane
    lane = make_policy(8, priority_slots=1, preempt_steps=4, priority_overflow=2, hold_back_ms=50)
    assert type(lane) is PriorityLane and lane.priority_lane
    assert lane.priority_overflow == 0, "no overflow rows beside a lane of its own"
    assert (lane.preempt_steps, lane.hold_back_s) == (4, 0.05)


@pytest.mark.parametrize("priority", [0, 1, 2, 3])
def test_one_shared_lane_for_every_priority_without_a_priority_lane(priority):
    assert SharedBatch(max_batch=4).lane(priority) == NORMAL


def test_priority_one_has_a_lane_of_its_own_with_a_priority_lane():
    policy = PriorityLane(max_batch=4, preempt_steps=2)
    assert [policy.lane(p) for p in (0, 1, 2, 3)] == [URGENT, URGENT, NORMAL, NORMAL]


def test_priority_two_leaves_the_reserved_rows_to_priority_one():
    policy = SharedBatch(max_batch=4, priority_slots=1)
    assert [policy.may_admit(NORMAL, 2, rows, rows) for rows in range(5)] == [True, True, True, False, False]
    assert [policy.may_admit(NORMAL, 1, rows, rows) for rows in range(5)] == [True, True, True, True, False]


def test_reserved_rows_leave_priority_two_at_least_one():
    assert SharedBatch(max_batch=2, priority_slots=5).priority_slots == 1
    assert SharedBatch(max_batch=2, priority_slots=-3).priority_slots == 0
    assert SharedBatch(max_batch=2, priority_slots=5).may_admit(NORMAL, 2, 0, 0)


def test_in_a_shared_lane_priority_one_takes_overflow_rows_past_max_batch():
    policy = SharedBatch(max_batch=3, priority_slots=1, priority_overflow=2)
    assert [policy.may_admit(NORMAL, 1, rows, rows) for rows in range(3, 6)] == [True, True, False]
    assert not policy.may_admit(NORMAL, 2, 2, 2), "priority 2 never takes them"
    assert SharedBatch(max_batch=3, priority_overflow=-1).priority_overflow == 0


def test_on_its_own_lane_priority_one_fills_max_batch_whatever_priority_two_holds():
    policy = PriorityLane(max_batch=3, priority_slots=1, preempt_steps=4)
    assert policy.may_admit(URGENT, 1, lane_rows=2, rows=4)
    assert not policy.may_admit(URGENT, 1, lane_rows=3, rows=3)


def test_priority_one_rows_count_against_priority_twos_own_lane():
    policy = PriorityLane(max_batch=3, priority_slots=1, preempt_steps=4)
    assert policy.may_admit(NORMAL, 2, lane_rows=0, rows=1)
    assert not policy.may_admit(NORMAL, 2, lane_rows=0, rows=2), "two priority-1 rows fill max_batch - slots"


def test_a_shared_lane_is_every_iterations_turn():
    assert SharedBatch(max_batch=4).turn(urgent_ready=True, normal_busy=True, streak=7) == (NORMAL, 0)


def test_priority_two_gets_one_iteration_after_every_preempt_steps_of_priority_one():
    policy = PriorityLane(max_batch=4, preempt_steps=2)
    turns, streak = [], 0
    for _ in range(7):
        lane, streak = policy.turn(urgent_ready=True, normal_busy=True, streak=streak)
        turns.append(lane)
    assert turns == [URGENT, URGENT, NORMAL] * 2 + [URGENT]


def test_priority_one_keeps_the_turn_while_priority_two_has_nothing_to_do():
    policy = PriorityLane(max_batch=4, preempt_steps=2)
    assert policy.turn(urgent_ready=True, normal_busy=False, streak=5) == (URGENT, 6)
    assert policy.turn(urgent_ready=False, normal_busy=False, streak=5) == (NORMAL, 0), "nothing to do: restart"


def test_a_backlogged_priority_two_waits_out_hold_back_ms_from_its_last_step():
    policy = PriorityLane(max_batch=4, preempt_steps=4, hold_back_ms=50)
    assert policy.hold_back(normal_waiting=1, urgent_busy=True, normal_stepped=10.0, now=10.02) == pytest.approx(0.03)
    assert policy.hold_back(normal_waiting=1, urgent_busy=True, normal_stepped=10.0, now=10.06) <= 0, "its step is due"


@pytest.mark.parametrize(
    "policy,waiting,busy",
    [
        (PriorityLane(max_batch=4, preempt_steps=4, hold_back_ms=50), 0, True),  # keeping up: no backlog
        (PriorityLane(max_batch=4, preempt_steps=4, hold_back_ms=50), 3, False),  # priority 1 idle
        (PriorityLane(max_batch=4, preempt_steps=4, hold_back_ms=0), 3, True),  # hold-back off
        (SharedBatch(max_batch=4), 3, True),
    ],
)
def test_priority_two_goes_at_once_otherwise(policy, waiting, busy):
    assert policy.hold_back(normal_waiting=waiting, urgent_busy=busy, normal_stepped=10.0, now=10.0) == 0
