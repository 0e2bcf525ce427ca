"""The session replay (perf/driver.py) over perf/load.py's open loop, with a fake chat client."""

from __future__ import annotations

import threading

from perf.driver import drive, summarize
from perf.workload import Session
from switchboard.client import ChatError, ChatStats


class FakeChat:
    """Streams two deltas and the stats; refuses the turns in ``refuse`` (UNAVAILABLE)."""

    def __init__(self, refuse: tuple = ()):
        self.refuse = set(refuse)
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str]] = []

    def chat(self, text, session_id, priority, max_new_tokens):
        with self.lock:
            self.calls.append((session_id, text))
        if text in self.refuse:
            raise ChatError("the queue is full", "UNAVAILABLE")
        yield "hello"
        yield " there"
        yield ChatStats(prompt_tokens=7, reused_tokens=3, generated_tokens=2)


def session(ident: str, arrival_s: float, *turns: str) -> Session:
    return Session(ident, arrival_s, 2, "en", list(turns), 16)


def test_sessions_replay_turn_after_turn_and_stop_at_a_failed_turn():
    client = FakeChat(refuse=("b2",))
    sessions = [
        session("s2", 0.05, "b1", "b2", "b3"),
        session("s1", 0.0, "a1", "a2", "a3"),
        session("late", 100.0, "z1"),  # after the run's arrival window: never sent
    ]
    records, wall = drive(client, sessions, max_seconds=5, session_prefix="p-")
    assert wall > 0
    assert [t for s, t in client.calls if s == "p-s1"] == ["a1", "a2", "a3"]
    assert [t for s, t in client.calls if s == "p-s2"] == ["b1", "b2"]  # b3 not sent after the refusal
    assert not any(s == "p-late" for s, _ in client.calls)
    by = {(r.session, r.turn): r for r in records}
    assert sorted(by) == [("s1", 1), ("s1", 2), ("s1", 3), ("s2", 1), ("s2", 2)]
    assert by[("s2", 2)].ok is False and by[("s2", 2)].status == "UNAVAILABLE"
    ok = [r for r in records if r.ok]
    assert all(r.deltas == 2 and r.generated == 2 and r.reused == 3 and r.ttft_ms <= r.e2e_ms for r in ok)
    (row,) = summarize(records, wall)
    assert (row["turns"], row["failed"], row["rejected"]) == (5, 1, 1)
