"""Switchboard's Grafana dashboard, generated with grafana-foundation-sdk:
``python -m switchboard.ops.dashboard write|check``.

``write`` renders monitoring/grafana/switchboard.json (``make dashboard``); ``check`` exits 1
when that file differs from what the code renders (tests/unit/test_dashboard.py does the
same). The benchmark suite's ``python -m perf.dashboard_run`` runs a private stack under
real load with Prometheus scraping it and draws every panel of the dashboard from
Prometheus' answers with matplotlib (docs/dashboard.png). Every query reads
only series the server exports (tests/integration/test_dashboard_queries.py) and a datasource
variable picks the Prometheus to read, so the file imports into any Grafana.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus as gp
from grafana_foundation_sdk.builders import timeseries as gt
from grafana_foundation_sdk.builders.common import (
    GraphThresholdsStyleConfig,
    StackingConfig,
    VizLegendOptions,
    VizTooltipOptions,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    GraphTresholdsStyleMode,
    LegendDisplayMode,
    LegendPlacement,
    StackingMode,
    TooltipDisplayMode,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    Threshold,
    ThresholdsMode,
)

from switchboard import paths
from switchboard.ops.promql import metric_names

OUT = paths.ROOT / "monitoring" / "grafana" / "switchboard.json"
UID = "switchboard"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# Grafana's rate window: at least four scrape intervals. Prometheus itself does not know it, so
# the tests and the picture put a window of their own in its place (``with_window``).
RATE_WINDOW = "$__rate_interval"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    stacked: bool = False
    max: float | None = None
    threshold: float | None = None  # a red line where the alert fires


def _rate(series: str) -> str:
    return f"rate({series}[{RATE_WINDOW}])"


def _quantiles(histogram: str) -> tuple[Query, ...]:
    return tuple(
        Query(
            f"histogram_quantile({q}, sum by (le, priority) ({_rate(histogram + '_bucket')}))",
            f"P{round(q * 100)} priority {{{{priority}}}}",
        )
        for q in (0.5, 0.95, 0.99)
    )


def _sum_rate(series: str, by: str = "") -> str:
    return f"sum by ({by}) ({_rate(series)})" if by else f"sum({_rate(series)})"


def _share(numerator: str, denominator: str) -> str:
    return f"{numerator} / clamp_min({denominator}, 1e-9)"


def _per_second(family: str, by: str, legend: str) -> Query:
    return Query(_sum_rate(family, by), legend)


LATENCY = (
    PanelSpec(
        "Time to first token by priority",
        "P50/P95/P99 from arrival at chat to the first text (FAQ answers: their whole time). "
        "Alert: P99 over 800 ms for 2 min.",
        "s",
        _quantiles("switchboard_chat_time_to_first_token_seconds"),
        threshold=0.8,
    ),
    PanelSpec(
        "Inter-token latency by priority",
        "P50/P95/P99 of a generated answer's mean gap between tokens after the first.",
        "s",
        _quantiles("switchboard_chat_inter_token_seconds"),
    ),
    PanelSpec(
        "End-to-end latency by priority",
        "P50/P95/P99 from arrival to the final response. Alert: P99 over 1.5 s for 2 min.",
        "s",
        _quantiles("switchboard_chat_duration_seconds"),
        threshold=1.5,
    ),
)
THROUGHPUT = (
    PanelSpec(
        "Tokens/s by priority",
        "Tokens generated for answered chats, per second.",
        "suffix: tok/s",
        (_per_second("switchboard_chat_generated_tokens_total", "priority", "priority {{priority}}"),),
        stacked=True,
    ),
    PanelSpec(
        "Chats/s by outcome",
        "Chats by how they ended: generated, fallback (FAQ answer), invalid, unavailable, cancelled, error.",
        "reqps",
        (_per_second("switchboard_chat_requests_total", "outcome", "{{outcome}}"),),
        stacked=True,
    ),
    PanelSpec(
        "Engine time per pool",
        "Seconds per second each pool spends in prefill and decode forward passes.",
        "suffix: s/s",
        (
            _per_second("switchboard_engine_prefill_s_total", "model", "{{model}} prefill"),
            _per_second("switchboard_engine_decode_s_total", "model", "{{model}} decode"),
        ),
    ),
)
BATCHING = (
    PanelSpec(
        "Decode steps/s by batch size",
        "Decode steps per second by the number of rows in the batch, per pool.",
        "suffix: steps/s",
        (_per_second("switchboard_engine_batch_steps_total", "model, batch_size", "{{model}} x{{batch_size}}"),),
    ),
    PanelSpec(
        "Engine batch rows and queue",
        "Sequences in each pool's running batch and waiting for a row (sampled once a second).",
        "short",
        (
            Query("sum by (model) (switchboard_engine_running)", "{{model}} running"),
            Query("sum by (model) (switchboard_engine_waiting)", "{{model}} waiting"),
        ),
    ),
    PanelSpec(
        "Padding share per pool",
        "Decode: masked attention positions over all positions. Prefill: left-padding positions "
        "over all input positions of batched prefill.",
        "percentunit",
        (
            Query(
                f"sum by (model) ({_rate('switchboard_engine_decode_padded_columns_total')})"
                f" / sum by (model) ({_rate('switchboard_engine_decode_columns_total')})",
                "{{model}} decode",
            ),
            Query(
                f"1 - sum by (model) ({_rate('switchboard_engine_prefill_tokens_total')})"
                f" / sum by (model) ({_rate('switchboard_engine_prefill_padded_tokens_total')})",
                "{{model}} prefill",
            ),
        ),
        max=1,
    ),
)
KV = (
    PanelSpec(
        "KV blocks reused/s by tier",
        "Stored KV blocks a prompt reused, by where they came from (the pool's memory, Redis), and new blocks stored.",
        "suffix: blocks/s",
        (
            _per_second("switchboard_kv_hit_blocks_total", "tier", "hit {{tier}}"),
            Query(_sum_rate("switchboard_kv_stored_blocks_total"), "stored"),
        ),
    ),
    PanelSpec(
        "Cache misses by reason",
        "Chats that reused less KV than their session stored, by reason (docs/kv-cache.md).",
        "suffix: chats/s",
        (_per_second("switchboard_chat_cache_misses_total", "reason", "{{reason}}"),),
        stacked=True,
    ),
    PanelSpec(
        "KV reuse and session hits",
        "Share of prompt tokens whose KV came from stored blocks; share of session lookups "
        "that found the conversation.",
        "percentunit",
        (
            Query(
                _share(
                    _sum_rate("switchboard_kv_reused_tokens_total"),
                    _sum_rate("switchboard_kv_reused_tokens_total")
                    + " + "
                    + _sum_rate("switchboard_engine_prefill_tokens_total"),
                ),
                "prompt tokens reused",
            ),
            Query(
                _share(
                    _sum_rate('switchboard_chat_sessions_total{status="hit"}'),
                    _sum_rate('switchboard_chat_sessions_total{status=~"hit|miss"}'),
                ),
                "session lookups found",
            ),
        ),
        max=1,
    ),
)
FALLBACKS = (
    PanelSpec(
        "Fallbacks and sheds by reason",
        "FAQ answers by reason, and chats the admission queue answered without a generation slot.",
        "suffix: chats/s",
        (
            _per_second("switchboard_chat_fallbacks_total", "reason", "fallback {{reason}}"),
            _per_second("switchboard_chat_sheds_total", "reason", "shed {{reason}}"),
        ),
    ),
    PanelSpec(
        "Fallback share",
        "FAQ answers over all chats. Alert: over 5% (5 min) for 5 min.",
        "percentunit",
        (
            Query(
                _share(_sum_rate("switchboard_chat_fallbacks_total"), _sum_rate("switchboard_chat_requests_total")),
                "fallback share",
            ),
        ),
        max=1,
        threshold=0.05,
    ),
    PanelSpec(
        "Admission queue",
        "Chats waiting in chat's admission queue for a generation slot, and chats holding one.",
        "short",
        (
            Query("sum(switchboard_chat_admission_waiting)", "waiting"),
            Query("sum(switchboard_chat_admission_running)", "running"),
        ),
    ),
)
HEALTH = (
    PanelSpec(
        "Pools up",
        "1 while chat routes to the pool, 0 while it routes around it (its stub died); the lowest over replicas.",
        "short",
        (Query("min by (pool) (switchboard_chat_pool_up)", "{{pool}}"),),
        max=1,
    ),
    PanelSpec(
        "Restarts (last 15 min)",
        "Server restarts seen as the sum of chat's request counters going back to zero (summed "
        "first: a restarted server's series carry new label values, e.g. its pid). The supervisor "
        "restarts tritonserver when it dies or stops answering; it exports no counter of its own.",
        "short",
        (Query("resets(sum by (instance) (switchboard_chat_requests_total)[15m:15s])", "{{instance}}"),),
    ),
    PanelSpec(
        "Redis failures",
        "Failed KV block calls to Redis, and session lookups that found Redis down (chats go on without history).",
        "suffix: /s",
        (
            Query(_sum_rate("switchboard_kv_redis_failures_total"), "KV block calls failed"),
            Query(_sum_rate('switchboard_chat_sessions_total{status="unavailable"}'), "session lookups without Redis"),
        ),
    ),
)
SPEECH = (
    PanelSpec(
        "Speech latency by priority",
        "P50/P95/P99 of a transcription's arrival at asr to its last text (voice_chat's transcripts included).",
        "s",
        _quantiles("switchboard_asr_duration_seconds"),
    ),
    PanelSpec(
        "Audio heard per second",
        "Seconds of audio transcribed per second (the inverse real-time factor), by priority.",
        "suffix: audio s/s",
        (_per_second("switchboard_asr_audio_seconds_total", "priority", "priority {{priority}}"),),
        stacked=True,
    ),
    PanelSpec(
        "Transcriptions by outcome",
        "transcribed, invalid (audio or language refused), unavailable (max_pending_s of audio held), shed_breaker "
        "(refused while the latency breaker is open), cancelled, "
        "error.",
        "suffix: req/s",
        (_per_second("switchboard_asr_requests_total", "outcome", "{{outcome}}"),),
        stacked=True,
    ),
    PanelSpec(
        "Audio held by the pool",
        "Seconds of audio decoded and waiting or being transcribed, over every replica; beyond asr's "
        "max_pending_s new requests are refused.",
        "s",
        (Query("sum(switchboard_asr_pending_audio_seconds)", "audio held"),),
    ),
)
_CONVERSATIONS = _sum_rate("switchboard_chat_conversations_total")
_HANDOVERS = _sum_rate("switchboard_chat_handovers_total")
_ANSWERS = 'switchboard_chat_requests_total{outcome=~"generated|fallback"}'
BUSINESS = (
    PanelSpec(
        "Conversations and hand-overs",
        "Conversations started (a first turn answered), handed over to a person (an answer that called "
        "transfer_to_human), and the difference: resolved without a hand-over. Per second.",
        "suffix: conv/s",
        (
            Query(_CONVERSATIONS, "started"),
            Query(_HANDOVERS, "handed over"),
            Query(f"clamp_min({_CONVERSATIONS} - {_HANDOVERS}, 0)", "resolved without a hand-over"),
        ),
    ),
    PanelSpec(
        "Resolved without a hand-over, transfer-to-human rate",
        "Hand-overs to a person over conversations started (the transfer-to-human rate), and its complement: "
        "the share of conversations resolved without one.",
        "percentunit",
        (
            Query(_share(f"clamp_min({_CONVERSATIONS} - {_HANDOVERS}, 0)", _CONVERSATIONS), "resolved"),
            Query(_share(_HANDOVERS, _CONVERSATIONS), "transferred to a person"),
        ),
        max=1,
    ),
    PanelSpec(
        "Tool calls by tool",
        "Tool calls in answers per second: the demo's order tools by name, any other tool as other.",
        "suffix: calls/s",
        (_per_second("switchboard_chat_tool_calls_total", "tool", "{{tool}}"),),
        stacked=True,
    ),
    PanelSpec(
        "FAQ-answered share",
        "Answers from the FAQ fallback over all answers (generated and FAQ). SwitchboardFallbackShareHigh "
        "fires on FAQ answers over all chats above 5% (5 min) for 5 min.",
        "percentunit",
        (
            Query(
                _share(
                    _sum_rate('switchboard_chat_requests_total{outcome="fallback"}'),
                    _sum_rate(_ANSWERS),
                ),
                "FAQ-answered share",
            ),
        ),
        max=1,
        threshold=0.05,
    ),
    PanelSpec(
        "Abandoned chats",
        "Chats the client left before their final response, per second, by stage: waiting (for a generation "
        "slot) or answering (after it got one: in a pool's queue, prefill or mid-answer).",
        "suffix: chats/s",
        (_per_second("switchboard_chat_abandoned_total", "stage", "{{stage}}"),),
        stacked=True,
    ),
    PanelSpec(
        "Voice turns per conversation",
        "Answered voice turns over voice conversations started, in the window (at least one: turns "
        "of conversations begun before it count against one, not a near-zero rate).",
        "short",
        (
            Query(
                f"sum(increase(switchboard_voice_turns_total[{RATE_WINDOW}])) / "
                f"clamp_min(sum(increase(switchboard_voice_conversations_total[{RATE_WINDOW}])), 1)",
                "turns per conversation",
            ),
        ),
    ),
)
ROWS: tuple[tuple[str, tuple[PanelSpec, ...]], ...] = (
    ("Latency by priority", LATENCY),
    ("Throughput", THROUGHPUT),
    ("Engine batching and padding", BATCHING),
    ("KV cache", KV),
    ("Fallbacks and admission", FALLBACKS),
    ("Speech", SPEECH),
    ("Health", HEALTH),
    ("Business", BUSINESS),
)


def _panel(spec: PanelSpec, panel_id: int) -> gt.Panel:
    panel = (
        gt.Panel()
        .id(panel_id)
        .title(spec.title)
        .description(spec.description)
        .datasource(DATASOURCE)
        .unit(spec.unit)
        .min(0)
        .span(8)
        .height(8)
        .line_width(1)
        .fill_opacity(10 if spec.stacked else 0)
        .tooltip(VizTooltipOptions().mode(TooltipDisplayMode.MULTI))
        .legend(
            VizLegendOptions().show_legend(True).display_mode(LegendDisplayMode.LIST).placement(LegendPlacement.BOTTOM)
        )
    )
    if spec.max is not None:
        panel = panel.max(spec.max)
    if spec.stacked:
        panel = panel.stacking(StackingConfig().mode(StackingMode.NORMAL))
    if spec.threshold is not None:
        panel = panel.thresholds(
            gd.ThresholdsConfig()
            .mode(ThresholdsMode.ABSOLUTE)
            .steps([Threshold(value=None, color="green"), Threshold(value=spec.threshold, color="red")])
        ).thresholds_style(GraphThresholdsStyleConfig().mode(GraphTresholdsStyleMode.LINE))
    for i, q in enumerate(spec.queries):
        panel = panel.with_target(
            gp.Dataquery().ref_id(chr(ord("A") + i)).expr(q.expr).legend_format(q.legend).range().datasource(DATASOURCE)
        )
    return panel


def build() -> dict:
    """The dashboard as Grafana's JSON model (a dict)."""
    board = (
        gd.Dashboard("Switchboard")
        .uid(UID)
        .description("Chat latency by priority, throughput, engine batching, KV cache, fallbacks, health, business")
        .tags(["switchboard", "triton"])
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .time("now-1h", "now")
        .refresh("10s")
        .with_variable(gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    )
    panel_id = 1
    for title, specs in ROWS:
        board = board.with_row(gd.Row(title).id(panel_id))
        panel_id += 1
        for spec in specs:
            board = board.with_panel(_panel(spec, panel_id))
            panel_id += 1
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def render_json(board: dict | None = None) -> str:
    return json.dumps(build() if board is None else board, indent=2, ensure_ascii=False) + "\n"


def panels(board: dict) -> list[dict]:
    """The panels of a dashboard that query something (rows left out), collapsed rows' included."""
    out = []
    for p in board.get("panels", []):
        if p.get("type") == "row":
            out += [q for q in p.get("panels", []) if q.get("targets")]
        elif p.get("targets"):
            out.append(p)
    return out


def unexported(board: dict, exported: set[str]) -> list[tuple[str, str, str]]:
    """(panel title, query ref, metric name) for every metric a query reads that is not in
    ``exported`` (the series names of a server's /metrics: ``promql.exported_names``)."""
    return [
        (p["title"], t["refId"], name)
        for p in panels(board)
        for t in p["targets"]
        for name in metric_names(t["expr"])
        if name not in exported
    ]


def with_window(expr: str, window: str) -> str:
    """``expr`` with Grafana's rate window replaced, for Prometheus itself."""
    return expr.replace(RATE_WINDOW, window)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.ops.dashboard", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    default = OUT.relative_to(paths.ROOT)
    for action, doc in (
        ("write", "write the dashboard JSON (make dashboard)"),
        ("check", "exit 1 if the JSON differs from what the code renders"),
    ):
        sub.add_parser(action, help=doc).add_argument("--out", type=Path, default=OUT, help=f"default {default}")
    args = p.parse_args(argv)
    text = render_json()
    if args.action == "check":
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is not what switchboard/ops/dashboard.py renders: run `make dashboard`")
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"[dashboard] {len(panels(json.loads(text)))} panels in {len(ROWS)} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
