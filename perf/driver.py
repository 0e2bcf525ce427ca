"""Session-aware load driver: ``python -m perf.driver``.

perf_analyzer sends independent requests; multi-turn chat needs each turn sent after the
previous answer, in the same session. This driver replays a workload file (see
``perf.workload``): every session starts at its arrival time on its own thread (an open loop
whose item is a session, ``perf.load``) and sends its turns one after another. Per turn it
records time to first token, the gaps between streamed deltas, end-to-end latency, tokens
generated and reused, route, priority and turn number; failures are recorded with their gRPC
status (rejections are ``UNAVAILABLE``/``RESOURCE_EXHAUSTED``), never dropped.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from perf.load import open_loop
from perf.markdown import number, table
from perf.stats import percentile
from perf.workload import Session, load
from switchboard.client import ChatClient, ChatError, ChatStats


@dataclass
class TurnRecord:
    session: str
    turn: int
    priority: int
    sent_s: float  # since the start of the run
    ok: bool = True
    status: str | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    deltas: int = 0
    generated: int = 0
    prompt_tokens: int = 0
    reused: int = 0
    route: str | None = None
    fallback: bool = False


ABANDONED = "ABANDONED"
REJECTED = (
    "UNAVAILABLE",
    "RESOURCE_EXHAUSTED",
    "HTTP_503",
    "HTTP_504",
)  # still streaming when the run's hard stop came; cancelled by the driver


def run_session(
    client,
    s: Session,
    t0: float,
    records: list,
    lock: threading.Lock,
    deadline: float,
    session_prefix: str = "",
    hard_stop: float = float("inf"),
) -> None:
    """``s``'s turns one after another, from its arrival (``drive``'s open loop sends it then)."""
    for i, text in enumerate(s.turns, 1):
        if time.perf_counter() > deadline:
            return
        rec = TurnRecord(s.id, i, s.priority, time.perf_counter() - t0)
        start = last = time.perf_counter()
        try:
            for event in client.chat(
                text, session_id=session_prefix + s.id, priority=s.priority, max_new_tokens=s.max_new_tokens
            ):
                now = time.perf_counter()
                if now > hard_stop:
                    raise ChatError("the run ended first", ABANDONED)  # leaving the loop cancels the stream
                if isinstance(event, ChatStats):
                    rec.generated, rec.prompt_tokens = event.generated_tokens, event.prompt_tokens
                    rec.reused, rec.route, rec.fallback = event.reused_tokens, event.route, event.fallback
                    continue
                if rec.ttft_ms is None:
                    rec.ttft_ms = (now - start) * 1000
                else:
                    rec.itl_ms.append((now - last) * 1000)
                rec.deltas += 1
                last = now
            rec.e2e_ms = (time.perf_counter() - start) * 1000
        except ChatError as e:
            rec.ok, rec.status = False, e.code or "ERROR"
            rec.e2e_ms = (time.perf_counter() - start) * 1000
        with lock:
            records.append(rec)
        if not rec.ok:
            return  # a customer whose turn failed does not carry on with the script


def drive(
    client, sessions: list[Session], max_seconds: float = 600, session_prefix: str = "", grace_s: float = 120
) -> tuple[list[TurnRecord], float]:
    """Replay ``sessions`` against ``client`` (a ``ChatClient``, or anything with its ``chat``).

    No turn starts after ``max_seconds``; turns still streaming ``grace_s`` later are cancelled
    and recorded as ``ABANDONED``. Returns the records and the wall time."""
    if isinstance(client, str):
        client = ChatClient(client, timeout_s=120)
    records: list[TurnRecord] = []
    lock = threading.Lock()
    t0 = time.perf_counter()
    deadline = t0 + max_seconds
    hard_stop = deadline + grace_s
    # An open loop whose item is a session: each starts at its arrival, whatever is in flight;
    # those arriving after the run's arrival window are not sent.
    due = sorted((s for s in sessions if t0 + s.arrival_s <= deadline), key=lambda s: s.arrival_s)
    sent = open_loop(
        lambda s: run_session(client, s, t0, records, lock, deadline, session_prefix, hard_stop),
        [(s.arrival_s, s) for s in due],
        clock=time.perf_counter,
        start=t0,
    )
    for r in sent:
        if not r.ok:  # not a failed turn (those are records): the session itself broke
            print(f"session {r.item.id}: {type(r.error).__name__}: {r.error}", file=sys.stderr, flush=True)
    return records, time.perf_counter() - t0


def summarize(records: list[TurnRecord], wall_s: float, key=None) -> list[dict]:
    """One row per group (all, or by ``key``: priority, route, turn)."""
    groups: dict = {}
    for r in records:
        groups.setdefault("all" if key is None else getattr(r, key), []).append(r)
    rows = []
    for name, rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        ok = [r for r in rs if r.ok]
        ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
        itl = [x for r in ok for x in r.itl_ms]
        e2e = [r.e2e_ms for r in ok]
        rows.append(
            {
                "group": name,
                "turns": len(rs),
                "failed": len(rs) - len(ok),
                "rejected": sum(r.status in REJECTED for r in rs),
                "requests_per_s": len(ok) / wall_s,
                "output_tokens_per_s": sum(r.generated for r in ok) / wall_s,
                "ttft_p50_ms": percentile(ttft, 50),
                "ttft_p90_ms": percentile(ttft, 90),
                "ttft_p99_ms": percentile(ttft, 99),
                "itl_p50_ms": percentile(itl, 50),
                "itl_p99_ms": percentile(itl, 99),
                "e2e_p50_ms": percentile(e2e, 50),
                "e2e_p90_ms": percentile(e2e, 90),
                "e2e_p99_ms": percentile(e2e, 99),
                "reused_tokens": sum(r.reused for r in ok),
                "prompt_tokens": sum(r.prompt_tokens for r in ok),
            }
        )
    return rows


def summary_table(rows: list[dict], title: str) -> str:
    """``summarize``'s rows as markdown, ``title`` heading the group column."""
    header = [title, "turns", "failed", "rejected", "req/s", "out tok/s", "TTFT P50/P90/P99 ms", "ITL P50/P99 ms"]
    header += ["E2E P50/P90/P99 ms", "reused/prompt tokens"]
    cells = [
        [
            r["group"],
            r["turns"],
            r["failed"],
            r["rejected"],
            number(r["requests_per_s"], 2),
            number(r["output_tokens_per_s"], 0),
            "/".join(number(r[f"ttft_{q}_ms"], 0) for q in ("p50", "p90", "p99")),
            "/".join(number(r[f"itl_{q}_ms"], 1) for q in ("p50", "p99")),
            "/".join(number(r[f"e2e_{q}_ms"], 0) for q in ("p50", "p90", "p99")),
            f"{r['reused_tokens']}/{r['prompt_tokens']}",
        ]
        for r in rows
    ]
    return table(header, cells) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.driver", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="127.0.0.1:8001", help="Triton gRPC address")
    p.add_argument("--workload", type=Path, default=Path("build/perf/workload.jsonl"))
    p.add_argument("--out", type=Path, default=Path("build/perf/driver"))
    p.add_argument("--max-seconds", type=float, default=600, help="no turn starts after this")
    p.add_argument("--grace-seconds", type=float, default=120, help="then turns still streaming are cancelled")
    args = p.parse_args(argv)
    _, sessions = load(args.workload)
    records, wall = drive(args.url, sessions, args.max_seconds, grace_s=args.grace_seconds)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "turns.jsonl").open("w") as f:
        for r in records:
            f.write(json.dumps(asdict(r)) + "\n")
    text = "\n".join(
        summary_table(summarize(records, wall, k), k or "all") for k in (None, "priority", "route", "turn")
    )
    (args.out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
