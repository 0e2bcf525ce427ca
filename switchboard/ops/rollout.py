"""Roll a new model version out to a running server, a canary share of sessions first:
``python -m switchboard.ops.rollout start|promote|rollback|status``.

``start --artifacts DIR`` checks the artifacts against their manifest (SHA-256 of the weights),
installs them as the next version of both pools (``engine_short/N``, ``engine_long/N``: staged,
checked again, then renamed into place), lists the version in the pools' ``version_policy``
(both edits are the repository's: switchboard/repository/install.py, versions.py) and loads them
through Triton's model-repository API, which answers only the operator key
(``launch.operator_key``). The pools check the weights once more before they serve. Only then
does ``chat`` get ``canary_version: N`` and ``canary_share``: Triton loads the new ``chat``
beside the old one and switches when it is ready, so no chat sees a half-loaded model; the
share of sessions whose hash falls under it (sticky: switchboard/serving/canary.py) goes to N.

Then it watches: every ``--interval-s`` it reads ``chat``'s metrics per version from each
server and compares the canary with the stable version since the switch (``judge``). When the
canary's error rate, FAQ-fallback share or P99 time to first token is worse by more than its
margin, it rolls back at once; when the canary has served ``--min-chats`` and ``--watch-s``
passed without that, it promotes it (``--no-promote``: it stops watching and leaves both).
``promote`` and ``rollback`` do the same by hand. KV is never reused across versions: the
version number is part of the fingerprint that keys blocks and conversations.

Every step leaves the repository consistent (configs are replaced atomically), so a server that
restarts mid-rollout loads the state the rollout had reached. Triton 2.51 reloads every version
of a model on each load (new instances beside the old ones, which finish their requests): a
step briefly holds the pools twice in memory.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from switchboard import paths
from switchboard.artifact.manifest import Manifest
from switchboard.ops.launch import operator_key
from switchboard.ops.model_control import ModelControlError, load_model
from switchboard.repository.install import install_version
from switchboard.repository.models import CHAT, POOL_MODELS
from switchboard.repository.versions import Repository, RepositoryError, verify_variant
from switchboard.serving.metrics import PREFIX


class RolloutError(RuntimeError):
    """A step could not be taken; the message says what and what state things are in."""


# -- the servers ----------------------------------------------------------------------------
@dataclass
class Server:
    """One tritonserver: its HTTP port (model-repository API) and metrics port."""

    http: str
    metrics: str

    def load(self, model: str, key: str, timeout_s: float = 600) -> None:
        try:
            load_model(self.http, model, key, timeout_s)
        except ModelControlError as e:
            raise RolloutError(str(e)) from None

    def scrape(self) -> str:
        with urllib.request.urlopen(f"{self.metrics}/metrics", timeout=10) as r:
            return r.read().decode()


# -- judging the canary ---------------------------------------------------------------------
@dataclass
class VersionStats:
    """What one version's chats added up to (counters, a histogram's cumulative buckets)."""

    outcomes: dict[str, float] = field(default_factory=dict)
    ttft_buckets: dict[float, float] = field(default_factory=dict)  # upper bound -> cumulative count

    @property
    def chats(self) -> float:
        """Chats that reached a model: generated, FAQ answers and failures, not the refused ones."""
        return sum(v for k, v in self.outcomes.items() if k not in ("invalid", "cancelled"))

    def share(self, *outcomes: str) -> float:
        return sum(self.outcomes.get(o, 0.0) for o in outcomes) / self.chats if self.chats else 0.0

    @property
    def error_rate(self) -> float:
        return self.share("unavailable", "error")

    @property
    def fallback_share(self) -> float:
        return self.share("fallback")

    def ttft_quantile(self, q: float) -> float | None:
        return histogram_quantile(q, self.ttft_buckets)

    def minus(self, before: VersionStats) -> VersionStats:
        """The difference since ``before`` (a reset counter counts from zero)."""

        def sub(now: dict, then: dict) -> dict:
            reset = any(now.get(k, 0.0) < v for k, v in then.items())
            return dict(now) if reset else {k: v - then.get(k, 0.0) for k, v in now.items()}

        return VersionStats(sub(self.outcomes, before.outcomes), sub(self.ttft_buckets, before.ttft_buckets))

    def plus(self, other: VersionStats) -> VersionStats:
        add = lambda a, b: {k: a.get(k, 0.0) + b.get(k, 0.0) for k in a.keys() | b.keys()}  # noqa: E731
        return VersionStats(add(self.outcomes, other.outcomes), add(self.ttft_buckets, other.ttft_buckets))


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' ``histogram_quantile`` over cumulative buckets (linear within a bucket; the
    last finite bound when the quantile falls in +Inf); None without observations."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    total = buckets[bounds[-1]]
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            width = count - below
            return lower + (bound - lower) * ((rank - below) / width if width > 0 else 1.0)
        lower, below = bound, count
    return lower


def version_stats(text: str) -> dict[tuple[str, str], VersionStats]:
    """Per (``version``, ``pid``) label pair (a chat process's series for one model version):
    chats by outcome and the time-to-first-token buckets (summed over priority and route), from a
    server's /metrics text."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[str, str], VersionStats] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            version = sample.labels.get("version")
            if version is None or version == "none":
                continue
            key = (version, sample.labels.get("pid", ""))
            if sample.name == PREFIX + "requests_total":
                stats = out.setdefault(key, VersionStats())
                outcome = sample.labels.get("outcome", "")
                stats.outcomes[outcome] = stats.outcomes.get(outcome, 0.0) + sample.value
            elif sample.name == PREFIX + "time_to_first_token_seconds_bucket":
                stats = out.setdefault(key, VersionStats())
                le = float(sample.labels["le"])
                stats.ttft_buckets[le] = stats.ttft_buckets.get(le, 0.0) + sample.value
    return out


@dataclass(frozen=True)
class Margins:
    """How much worse than the stable version the canary may be before it is rolled back."""

    error_rate: float = 0.02  # absolute: 2 more failed chats in 100
    fallback_share: float = 0.05  # absolute: 5 more FAQ answers in 100
    ttft_p99_ratio: float = 1.5  # canary P99 over stable P99 ...
    ttft_p99_slack_s: float = 0.05  # ... and over it by at least this (noise at millisecond P99s)
    min_chats: int = 20  # neither verdict before the canary served this many


@dataclass(frozen=True)
class Verdict:
    action: str  # "rollback", "promote" or "wait" ("ended": the trial ended by another command)
    reason: str


def judge(stable: VersionStats, canary: VersionStats, margins: Margins, watched_s: float, watch_s: float) -> Verdict:
    """Roll back when the canary is worse than the stable version by more than a margin, promote
    when it served enough chats for ``watch_s`` without that, else wait."""
    if canary.chats < margins.min_chats:
        return Verdict("wait", f"canary served {canary.chats:.0f} of the {margins.min_chats} chats needed to judge")
    if canary.error_rate > stable.error_rate + margins.error_rate:
        return Verdict(
            "rollback",
            f"error rate {canary.error_rate:.1%} vs stable {stable.error_rate:.1%} (margin {margins.error_rate:.0%})",
        )
    if canary.fallback_share > stable.fallback_share + margins.fallback_share:
        return Verdict(
            "rollback",
            f"FAQ-fallback share {canary.fallback_share:.1%} vs stable {stable.fallback_share:.1%} "
            f"(margin {margins.fallback_share:.0%})",
        )
    c99, s99 = canary.ttft_quantile(0.99), stable.ttft_quantile(0.99)
    if c99 is not None and s99 is not None:
        if c99 > s99 * margins.ttft_p99_ratio and c99 - s99 > margins.ttft_p99_slack_s:
            return Verdict(
                "rollback",
                f"P99 time to first token {c99 * 1000:.0f} ms vs stable {s99 * 1000:.0f} ms "
                f"(limit {margins.ttft_p99_ratio:g}x)",
            )
    if watched_s >= watch_s:
        return Verdict("promote", f"{canary.chats:.0f} canary chats over {watched_s:.0f} s within every margin")
    return Verdict("wait", f"within margins; {watch_s - watched_s:.0f} s of watching left")


# -- the steps ------------------------------------------------------------------------------
class Rollout:
    def __init__(self, repository: Path, servers: list[Server], key: str, run_dir: Path, log=print):
        self.repo, self.servers, self.key, self.run_dir = Repository(Path(repository)), servers, key, Path(run_dir)
        self.log = log
        self.timeline = self.run_dir / "rollout.jsonl"

    def record(self, event: str, **details) -> None:
        """One line of the rollout's timeline (``rollout.jsonl`` in the run directory) and the log."""
        entry = {"t": time.time(), "event": event, **details}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with self.timeline.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
        text = ", ".join(f"{k} {v}" for k, v in details.items())
        self.log(f"[rollout] {event}" + (f": {text}" if text else ""))

    def _load(self, *models: str) -> None:
        for server in self.servers:
            for model in models:
                server.load(model, self.key)

    def status(self) -> dict:
        return {**self.repo.chat(), "served": self.repo.served(), "installed": self.repo.installed()}

    def start(self, artifacts: Path, precision: str, share: float) -> int:
        """Install ``artifacts`` as the next version and send ``share`` of sessions to it; the new version's number."""
        state = self.repo.chat()
        if state["canary_version"]:
            raise RolloutError(f"version {state['canary_version']} is already on trial: promote or roll it back first")
        if not 0.0 < share <= 1.0:
            raise RolloutError(f"--share {share}: expected a share in (0, 1]")
        artifacts = Path(artifacts)
        manifest = Manifest.load(artifacts)
        verify_variant(artifacts, manifest, precision)  # before anything is copied
        stable = state["stable_version"]
        number = max([*self.repo.installed(), *self.repo.served(), stable]) + 1
        install_version(self.repo, artifacts, number, precision, self.run_dir / "rollout-staging")
        self.record(
            "installed", version=number, precision=precision, fingerprint=manifest.variant(precision)["fingerprint"]
        )
        self.repo.set_served([stable, number])
        try:
            self._load(*POOL_MODELS)
        except RolloutError as e:
            self.repo.set_served([stable])
            self.repo.remove(number)
            try:
                self._load(*POOL_MODELS)
            finally:
                self.record("refused", version=number, reason=str(e))
            raise RolloutError(f"version {number} was refused; version {stable} serves on. {e}") from None
        self.repo.set_chat(stable, number, share)
        self._load(CHAT)
        self.record("canary", version=number, stable=stable, share=share)
        return number

    def promote(self) -> int:
        state = self.repo.chat()
        canary = state["canary_version"]
        if not canary:
            raise RolloutError("no canary to promote")
        self.repo.set_chat(canary, 0)
        self._load(CHAT)  # every new chat on the canary ...
        self.repo.set_served([canary])
        self._load(*POOL_MODELS)  # ... then the old version unloads once its last chats finished
        self.record("promoted", version=canary, retired=state["stable_version"])
        return canary

    def rollback(self, reason: str = "by hand") -> int:
        state = self.repo.chat()
        canary, stable = state["canary_version"], state["stable_version"]
        if not canary:
            raise RolloutError("no canary to roll back")
        self.repo.set_chat(stable, 0)
        self._load(CHAT)  # the canary's sessions back to the stable version (their KV does not follow)
        self.repo.set_served([stable])
        self._load(*POOL_MODELS)
        self.repo.remove(canary)
        self.record("rolled_back", version=canary, stable=stable, reason=reason)
        return stable

    def watch(self, margins: Margins, watch_s: float, interval_s: float, promote: bool = True) -> Verdict:
        """Judge the canary every ``interval_s`` against the stable version, from now on."""
        state = self.repo.chat()
        stable, canary = str(state["stable_version"]), str(state["canary_version"])
        if canary == "0":
            raise RolloutError("no canary to watch")
        base = self._stats()
        t0 = time.monotonic()
        while True:
            time.sleep(interval_s)
            if self.repo.chat()["canary_version"] != int(canary):  # promoted or rolled back meanwhile
                verdict = Verdict("ended", f"version {canary} is no longer on trial (ended by another command)")
                self.record("watch_ended", version=int(canary))
                return verdict
            now = self._stats()
            # Per series since the start (a chat process that unloaded meanwhile drops out; a new
            # one counts from zero), summed per version.
            delta = {stable: VersionStats(), canary: VersionStats()}
            for (server, version, pid), stats in now.items():
                if version in delta:
                    since = stats.minus(base.get((server, version, pid), VersionStats()))
                    delta[version] = delta[version].plus(since)
            s, c = delta[stable], delta[canary]
            watched = time.monotonic() - t0
            verdict = judge(s, c, margins, watched, watch_s)
            self.record(
                "judged",
                watched_s=round(watched, 1),
                stable_chats=int(s.chats),
                canary_chats=int(c.chats),
                canary_error_rate=round(c.error_rate, 4),
                canary_fallback_share=round(c.fallback_share, 4),
                stable_fallback_share=round(s.fallback_share, 4),
                canary_ttft_p99_s=_round(c.ttft_quantile(0.99)),
                stable_ttft_p99_s=_round(s.ttft_quantile(0.99)),
                verdict=verdict.action,
            )
            if verdict.action == "rollback":
                self.rollback(verdict.reason)
                return verdict
            if verdict.action == "promote":
                if promote:
                    self.promote()
                return verdict

    def _stats(self) -> dict[tuple[int, str, str], VersionStats]:
        """Every server's series: (server, version, pid) -> stats."""
        return {
            (i, version, pid): stats
            for i, server in enumerate(self.servers)
            for (version, pid), stats in version_stats(server.scrape()).items()
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def servers_of(run_dir: Path, http_port: int, metrics_port: int) -> list[Server]:
    """The servers ``make serve`` started: every replica's, or the one on the given ports."""
    replicas = Path(run_dir) / "replicas.json"
    if replicas.exists():
        return [
            Server(f"http://127.0.0.1:{r['http_port']}", f"http://127.0.0.1:{r['metrics_port']}")
            for r in json.loads(replicas.read_text())
        ]
    return [Server(f"http://127.0.0.1:{http_port}", f"http://127.0.0.1:{metrics_port}")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m switchboard.ops.rollout",
        description="Roll a new model version out to the running server: a canary share of sessions, "
        "judged against the stable version, then promoted or rolled back.",
    )
    p.add_argument("action", choices=("start", "watch", "promote", "rollback", "status"))
    p.add_argument("--artifacts", type=Path, help="start: the exported artifacts (python -m switchboard.export --out)")
    p.add_argument("--precision", default="fp32", help="start: the variant to serve (default fp32)")
    p.add_argument("--share", type=float, default=0.1, help="start: share of sessions for the canary (default 0.1)")
    p.add_argument("--watch-s", type=float, default=300, help="promote after this long within margins (default 300)")
    p.add_argument("--interval-s", type=float, default=5, help="seconds between judgements (default 5)")
    p.add_argument("--min-chats", type=int, default=Margins.min_chats, help="canary chats needed to judge")
    p.add_argument("--error-margin", type=float, default=Margins.error_rate, help="absolute (default 0.02)")
    p.add_argument("--fallback-margin", type=float, default=Margins.fallback_share, help="absolute (default 0.05)")
    p.add_argument("--p99-ratio", type=float, default=Margins.ttft_p99_ratio, help="canary/stable P99 TTFT limit")
    p.add_argument("--no-promote", action="store_true", help="stop watching when it would promote; leave both")
    p.add_argument("--no-watch", action="store_true", help="start: install and start the canary, then return")
    p.add_argument("--repository", type=Path, default=paths.MODEL_REPOSITORY)
    p.add_argument("--run-dir", type=Path, default=paths.RUN, help="where `make serve` keeps its state and key")
    p.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT", 8000)))
    p.add_argument("--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT", 8002)))
    args = p.parse_args(argv)

    rollout = Rollout(args.repository, servers_of(args.run_dir, args.http_port, args.metrics_port), "", args.run_dir)
    if args.action == "status":
        print(json.dumps(rollout.status()))
        return 0
    rollout.key = operator_key(args.run_dir)
    margins = Margins(args.error_margin, args.fallback_margin, args.p99_ratio, min_chats=args.min_chats)
    try:
        if args.action == "start":
            if args.artifacts is None:
                p.error("start needs --artifacts")
            rollout.start(args.artifacts, args.precision, args.share)
            if args.no_watch:
                return 0
        if args.action in ("start", "watch"):
            verdict = rollout.watch(margins, args.watch_s, args.interval_s, promote=not args.no_promote)
            print(f"[rollout] {verdict.action}: {verdict.reason}")
            return 3 if verdict.action == "rollback" else 0
        if args.action == "promote":
            rollout.promote()
        elif args.action == "rollback":
            rollout.rollback()
    except (RolloutError, RepositoryError, ValueError, FileNotFoundError) as e:
        print(f"[rollout] {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
