"""The Grafana dashboard: the committed JSON is what the code renders, its panels cover what
issue 26 asks for, and the PromQL reader finds exactly the metric names a query selects."""

from __future__ import annotations

import json

import pytest

from switchboard.ops import dashboard
from switchboard.ops.promql import exported_names, metric_names

BOARD = dashboard.build()
EXPRS = {p["title"]: [t["expr"] for t in p["targets"]] for p in dashboard.panels(BOARD)}


def test_the_committed_json_is_what_the_code_renders():
    assert dashboard.OUT.read_text() == dashboard.render_json(), "run `make dashboard` and commit the JSON"


def test_check_tells_a_stale_file_from_a_fresh_one(tmp_path, capsys):
    out = tmp_path / "switchboard.json"
    assert dashboard.main(["write", "--out", str(out)]) == 0
    assert dashboard.main(["check", "--out", str(out)]) == 0
    out.write_text(out.read_text().replace("histogram_quantile(0.99", "histogram_quantile(0.9"))
    assert dashboard.main(["check", "--out", str(out)]) == 1
    assert "make dashboard" in capsys.readouterr().out


def _reading(metric: str, *words: str) -> list[str]:
    """Titles of the panels with a query that reads ``metric`` and contains every one of ``words``."""
    return [
        title
        for title, exprs in EXPRS.items()
        if any(metric in metric_names(e) and all(w in e for w in words) for e in exprs)
    ]


@pytest.mark.parametrize(
    "histogram",
    [
        "switchboard_chat_time_to_first_token_seconds",
        "switchboard_chat_inter_token_seconds",
        "switchboard_chat_duration_seconds",
    ],
)
def test_latency_percentiles_by_priority(histogram):
    for q in ("0.5", "0.95", "0.99"):
        assert _reading(histogram + "_bucket", f"histogram_quantile({q},", "by (le, priority)"), (histogram, q)


@pytest.mark.parametrize(
    "topic,metric,words",
    [
        ("tokens/s", "switchboard_chat_generated_tokens_total", ("by (priority)", "rate(")),
        ("batch sizes", "switchboard_engine_batch_steps_total", ("batch_size",)),
        ("decode padding", "switchboard_engine_decode_padded_columns_total", ()),
        ("prefill padding", "switchboard_engine_prefill_padded_tokens_total", ()),
        ("cache hits by tier", "switchboard_kv_hit_blocks_total", ("by (tier)",)),
        ("cache misses by reason", "switchboard_chat_cache_misses_total", ("by (reason)",)),
        ("fallbacks by reason", "switchboard_chat_fallbacks_total", ("by (reason)",)),
        ("sheds", "switchboard_chat_sheds_total", ()),
        ("queue depth", "switchboard_chat_admission_waiting", ()),
        ("running", "switchboard_chat_admission_running", ()),
        ("pools up", "switchboard_chat_pool_up", ()),
        ("restarts", "switchboard_chat_requests_total", ("resets(",)),
        ("conversations started", "switchboard_chat_conversations_total", ()),
        ("hand-overs", "switchboard_chat_handovers_total", ()),
        ("tool calls by tool", "switchboard_chat_tool_calls_total", ("by (tool)",)),
        ("FAQ-answered share", "switchboard_chat_requests_total", ('outcome="fallback"', "generated|fallback")),
        ("abandoned chats", "switchboard_chat_abandoned_total", ("by (stage)",)),
        ("voice turns per conversation", "switchboard_voice_conversations_total", ()),
    ],
)
def test_the_panels_cover_the_issue(topic, metric, words):
    assert _reading(metric, *words), f"no panel shows {topic}"


def test_panels_read_the_datasource_variable_not_a_fixed_one():
    [variable] = BOARD["templating"]["list"]
    assert (variable["type"], variable["name"], variable["query"]) == ("datasource", "datasource", "prometheus")
    for p in dashboard.panels(BOARD):
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert all(t["datasource"] == p["datasource"] for t in p["targets"]), p["title"]


def test_panel_ids_and_titles_are_unique_and_every_panel_has_a_place():
    ids = [p["id"] for p in BOARD["panels"]]
    titles = [p["title"] for p in dashboard.panels(BOARD)]
    assert len(set(ids)) == len(ids) and len(set(titles)) == len(titles)
    places = {(p["gridPos"]["x"], p["gridPos"]["y"]) for p in BOARD["panels"]}
    assert len(places) == len(BOARD["panels"])
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in BOARD["panels"])


@pytest.mark.parametrize(
    "expr,names",
    [
        (
            "histogram_quantile(0.99, sum by (le, priority) (rate(a_seconds_bucket[$__rate_interval])))",
            ["a_seconds_bucket"],
        ),
        ('sum(rate(a_total{reason="by", rate="x"}[5m])) by (reason) / clamp_min(sum(rate(b_total[5m])), 1e-9)', None),
        ("a * on (instance) group_left (pool) b offset 5m", ["a", "b"]),
        ("a / ignoring(x) group_right b", ["a", "b"]),
        ('{__name__="a", job="x"} + sum without (instance) (b)', ["a", "b"]),
        ("max_over_time(rate(a[1m])[5m:30s]) > bool 0 and b unless c or d", ["a", "b", "c", "d"]),
        ("SUM BY (le) (a) + Inf", ["a"]),
        ('label_replace(a, "dst", "$1", "src", "(.*)") + count_values("v", b)', ["a", "b"]),
        ("topk(5, a:recorded:rate5m) @ end()", ["a:recorded:rate5m"]),
        ("max by (instance) (resets(a_total[15m]))", ["a_total"]),
        ("vector(1) - time()", []),
    ],
)
def test_metric_names_skip_functions_labels_keywords_and_selectors(expr, names):
    assert metric_names(expr) == (names if names is not None else ["a_total", "b_total"])


@pytest.mark.parametrize("expr", ['{__name__=~"switchboard_.*"}', "sum(rate(a[5m])", "a{job='x'"])
def test_metric_names_refuses_what_it_cannot_check(expr):
    with pytest.raises(ValueError):
        metric_names(expr)


def test_a_made_up_metric_is_caught():
    exposition = (
        "# TYPE switchboard_chat_duration_seconds histogram\n"
        'switchboard_chat_duration_seconds_bucket{le="0.5",priority="1",route="short"} 3\n'
        "switchboard_chat_duration_seconds_sum 0.4\n"
        "switchboard_chat_duration_seconds_count 3\n"
        'switchboard_chat_pool_up{pool="engine_short"} 1\n'
    )
    exported = exported_names(exposition)
    assert exported == {
        "switchboard_chat_duration_seconds_bucket",
        "switchboard_chat_duration_seconds_sum",
        "switchboard_chat_duration_seconds_count",
        "switchboard_chat_pool_up",
    }
    board = json.loads(json.dumps(BOARD))
    first = dashboard.panels(board)[0]
    first["targets"][0]["expr"] = "sum(rate(switchboard_chat_made_up_total[5m])) / sum(switchboard_chat_pool_up)"
    missing = dashboard.unexported(board, exported)
    assert (first["title"], "A", "switchboard_chat_made_up_total") in missing
    assert not [m for m in missing if m[2] == "switchboard_chat_pool_up"]
    # the real dashboard against the real names reads histograms by their _bucket series
    assert ("End-to-end latency by priority", "A", "switchboard_chat_duration_seconds_bucket") not in (
        dashboard.unexported(BOARD, exported)
    )


def test_grafana_rate_window_is_replaced_for_prometheus():
    expr = EXPRS["Tokens/s by priority"][0]
    assert "$__rate_interval" in expr
    assert dashboard.with_window(expr, "30s") == expr.replace("$__rate_interval", "30s")


def test_provisioning_files_name_a_prometheus_datasource_and_the_dashboard_folder():
    import yaml

    root = dashboard.OUT.parent / "provisioning"
    [provider] = yaml.safe_load((root / "dashboards" / "switchboard.yml").read_text())["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]
    [source] = yaml.safe_load((root / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert source["type"] == BOARD["templating"]["list"][0]["query"] == "prometheus"
