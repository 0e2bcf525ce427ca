"""Customer-service traffic as files: ``python -m perf.workload``.

A workload is a JSON Lines file of sessions, each with its arrival time, priority class and
turns (3 to 6 user messages, each sent after the previous answer). Prompts spread from about
20 to 400+ tokens: most first turns are short FAQ questions, some paste long context (order
histories, complaints), and later turns grow with the conversation. Arrivals are Poisson at a
steady rate with 5x bursts. The same seed gives the same file, so every run, baseline and
optimized alike, replays the same traffic.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from switchboard.data import corpus as corpus_mod


@dataclass(frozen=True)
class WorkloadSpec:
    sessions: int = 60
    rate_per_s: float = 2.0  # steady session arrivals (Poisson)
    burst_every_s: float = 20.0  # a burst starts every ...
    burst_length_s: float = 5.0  # ... and lasts ...
    burst_factor: float = 5.0  # ... at this multiple of the steady rate
    min_turns: int = 3
    max_turns: int = 6
    vip_share: float = 0.15  # priority-1 (live/VIP) sessions
    long_share: float = 0.2  # first turns that paste long context
    max_new_tokens: int = 48
    seed: int = 0


@dataclass
class Session:
    id: str
    arrival_s: float
    priority: int
    lang: str
    turns: list[str] = field(default_factory=list)
    max_new_tokens: int = 48


def _arrivals(spec: WorkloadSpec, rng: random.Random) -> list[float]:
    """Non-homogeneous Poisson by thinning: rate x burst_factor inside bursts."""
    peak = spec.rate_per_s * spec.burst_factor
    t, out = 0.0, []
    while len(out) < spec.sessions:
        t += rng.expovariate(peak)
        in_burst = (t % spec.burst_every_s) >= spec.burst_every_s - spec.burst_length_s
        if rng.random() < (1.0 if in_burst else spec.rate_per_s / peak):
            out.append(round(t, 4))
    return out


def _long_context(rng: random.Random, lang: str, faq) -> str:
    """A message that pastes context, as customers do: several earlier questions and details."""
    pool = [e for e in faq if e.lang == lang]
    parts = []
    for _ in range(rng.randint(6, 12)):
        e = rng.choice(pool)
        parts.append(corpus_mod.fill_slots(corpus_mod.sample_slots(rng, lang), rng.choice(e.questions)))
    lead = "我之前的问题都没解决：" if lang == "zh" else "None of my earlier questions were answered: "
    return lead + " ".join(parts)


def generate(spec: WorkloadSpec) -> list[Session]:
    rng = random.Random(spec.seed)
    data = corpus_mod.load()
    faq = list(data.faq)
    sessions = []
    for i, t in enumerate(_arrivals(spec, rng)):
        lang = rng.choice(["en", "zh"])
        pool = [e for e in faq if e.lang == lang]
        slots = corpus_mod.sample_slots(rng, lang)
        n = rng.randint(spec.min_turns, spec.max_turns)
        turns = [corpus_mod.fill_slots(slots, rng.choice(rng.choice(pool).questions)) for _ in range(n)]
        if rng.random() < spec.long_share:
            turns[0] = _long_context(rng, lang, faq)
        sessions.append(
            Session(
                f"w{spec.seed}-s{i:04d}", t, 1 if rng.random() < spec.vip_share else 2, lang, turns, spec.max_new_tokens
            )
        )
    return sessions


def save(sessions: list[Session], spec: WorkloadSpec, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        f.write(json.dumps({"spec": asdict(spec)}) + "\n")
        for s in sessions:
            f.write(json.dumps(asdict(s), ensure_ascii=False) + "\n")
    return path


def load(path: Path) -> tuple[WorkloadSpec, list[Session]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    spec = WorkloadSpec(**json.loads(lines[0])["spec"])
    return spec, [Session(**json.loads(line)) for line in lines[1:] if line.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.workload", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("build/perf/workload.jsonl"))
    for name, default in WorkloadSpec().__dict__.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    args = vars(p.parse_args(argv))
    out = args.pop("out")
    spec = WorkloadSpec(**args)
    sessions = generate(spec)
    save(sessions, spec, out)
    turns = sum(len(s.turns) for s in sessions)
    print(
        f"{out}: {len(sessions)} sessions, {turns} turns, {sum(s.priority == 1 for s in sessions)} VIP, "
        f"last arrival at {sessions[-1].arrival_s:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
