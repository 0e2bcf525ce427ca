"""The rollout's pure parts: the canary's share by session hash, the verdict, the quantile, a
watch that ends when another command ended the trial (the repository's part: test_repository.py)."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from switchboard.ops.rollout import Margins, Rollout, VersionStats, histogram_quantile, judge, version_stats
from switchboard.repository.versions import Repository
from switchboard.serving.canary import VersionPicker, bucket, conversation_key

pytestmark = pytest.mark.unit


def test_the_canary_gets_its_share_of_sessions_and_each_session_stays_where_it_is():
    picker = VersionPicker(1, 2, 0.1)
    picks = [picker.pick(f"session-{i}") for i in range(20000)]
    assert 0.09 < picks.count(2) / len(picks) < 0.11
    assert all(picker.pick(f"session-{i}") == v for i, v in enumerate(picks[:500]))  # sticky
    assert VersionPicker(1).pick("any") == 1 and VersionPicker(1).versions == (1,)
    assert VersionPicker(3, 4, 1.0).pick("any") == 4 and VersionPicker(3, 4, 0.0).pick("any") == 3
    assert 0.0 <= bucket("x") < 1.0 and bucket("x") == bucket("x") != bucket("y")
    with pytest.raises(ValueError, match="stable"):
        VersionPicker(2, 2)


def test_a_stateless_conversation_keeps_its_version_by_its_first_message():
    first = conversation_key(None, None, "Where is my order?")
    later = conversation_key(None, ({"role": "user", "content": "Where is my order?"},), "And a refund?")
    assert first == later != conversation_key(None, None, "And a refund?")
    assert conversation_key("s-1", ({"role": "user", "content": "x"},), "y") == "s-1"


def test_histogram_quantile_interpolates_like_prometheus():
    buckets = {0.1: 50.0, 0.5: 90.0, 1.0: 100.0, float("inf"): 100.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.7, buckets) == pytest.approx(0.3)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.95)
    assert histogram_quantile(0.99, {0.1: 0.0, float("inf"): 0.0}) is None
    assert histogram_quantile(0.99, {0.1: 1.0, float("inf"): 10.0}) == pytest.approx(0.1)  # in +Inf: the last bound


def _stats(generated=100, fallback=0, error=0, fast=True):
    n = generated + fallback + error
    ttft = {0.05: float(n), float("inf"): float(n)} if fast else {0.05: 0.0, 1.0: float(n), float("inf"): float(n)}
    return VersionStats({"generated": generated, "fallback": fallback, "error": error, "invalid": 7}, ttft)


@pytest.mark.parametrize(
    "canary,action,words",
    [
        (_stats(5), "wait", "of the 20 chats"),
        (_stats(90, error=10), "rollback", "error rate"),
        (_stats(90, fallback=10), "rollback", "FAQ-fallback share"),
        (_stats(100, fast=False), "rollback", "P99 time to first token"),
        (_stats(99, fallback=1), "promote", "within every margin"),
    ],
)
def test_the_verdict_compares_the_canary_with_the_stable_version(canary, action, words):
    verdict = judge(_stats(), canary, Margins(), watched_s=300, watch_s=300)
    assert verdict.action == action and words in verdict.reason


def test_a_canary_within_margins_waits_for_the_watch_to_end():
    assert judge(_stats(), _stats(), Margins(), watched_s=10, watch_s=300).action == "wait"
    # invalid requests are the client's, not the version's
    assert _stats().chats == 100 and _stats(90, error=10).error_rate == pytest.approx(0.1)


def test_stats_per_version_and_process_from_metrics_text_and_their_differences():
    text = """# TYPE switchboard_chat_requests_total counter
switchboard_chat_requests_total{outcome="generated",pid="7",version="1"} 5
switchboard_chat_requests_total{outcome="fallback",pid="7",version="2"} 2
switchboard_chat_requests_total{outcome="invalid",pid="7",version="none"} 3
# TYPE switchboard_chat_time_to_first_token_seconds histogram
switchboard_chat_time_to_first_token_seconds_bucket{le="0.1",pid="7",priority="2",route="short",version="1"} 4
switchboard_chat_time_to_first_token_seconds_bucket{le="+Inf",pid="7",priority="2",route="short",version="1"} 5
switchboard_chat_time_to_first_token_seconds_bucket{le="0.1",pid="7",priority="1",route="short",version="1"} 1
switchboard_chat_time_to_first_token_seconds_bucket{le="+Inf",pid="7",priority="1",route="short",version="1"} 1
"""
    stats = version_stats(text)
    assert set(stats) == {("1", "7"), ("2", "7")}
    assert stats["1", "7"].outcomes == {"generated": 5.0} and stats["1", "7"].ttft_buckets == {
        0.1: 5.0,
        float("inf"): 6.0,
    }
    later = VersionStats({"generated": 9.0}, {0.1: 8.0, float("inf"): 10.0})
    assert later.minus(stats["1", "7"]).outcomes == {"generated": 4.0}
    assert later.minus(VersionStats({"generated": 20.0})).outcomes == {"generated": 9.0}  # a reset counts from 0


@pytest.fixture
def repo(tmp_path) -> Repository:
    """The rendered repository's configs, no artifacts."""
    for model in ("chat", "engine_short", "engine_long"):
        (tmp_path / model / "1").mkdir(parents=True)
        shutil.copy(Path("model_repository") / model / "config.pbtxt", tmp_path / model / "config.pbtxt")
    return Repository(tmp_path)


class _QuietServer:
    def scrape(self) -> str:
        return ""

    def load(self, model: str, key: str) -> None:
        pass


def test_a_watch_ends_when_the_trial_was_ended_by_another_command(repo, tmp_path):
    repo.set_chat(1, 2, 0.5)
    rollout = Rollout(repo.path, [_QuietServer()], "key", tmp_path / "run", log=lambda line: None)
    done = []
    watcher = threading.Thread(target=lambda: done.append(rollout.watch(Margins(), 300, 0.05)))
    watcher.start()
    time.sleep(0.2)
    assert not done  # no canary chats yet: it waits
    repo.set_chat(1, 0)  # `make rollback` from another shell
    watcher.join(5)
    assert done and done[0].action == "ended"
