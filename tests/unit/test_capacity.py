"""The capacity planner's pure parts (switchboard/ops/capacity): the calendar's validation, the
forecast, the plan's arithmetic, Kubernetes' HPA algorithm, the simulated Double-11 day and the
exporter's exposition."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from switchboard import paths
from switchboard.ops.capacity import calendar as cal
from switchboard.ops.capacity import forecast as fc
from switchboard.ops.capacity import simulate
from switchboard.ops.capacity.exporter import DESIRED, Planner, exposition
from switchboard.ops.capacity.hpa import Hpa, Policy, Rules, Spec, external_average_replicas, pods_metric_replicas
from switchboard.ops.capacity.plan import Sizing, plan

TZ = timezone(timedelta(hours=8))
EXAMPLE = paths.ROOT / "deploy" / "capacity" / "double-11.toml"
GOOD = """
lead_minutes = 10
[[promotion]]
name = "flash sale"
start = 2026-11-11T20:00:00+08:00
end = 2026-11-11T20:30:00+08:00
multiplier = 5.0
[[promotion]]
name = "live stream"
start = 2026-11-11T04:00:00Z
end = 2026-11-11T05:00:00Z
replicas = 6
lead_minutes = 20
"""


def _hpa_spec() -> Spec:
    return Spec.from_manifest(yaml.safe_load((paths.K8S / "hpa.yaml").read_text()))


# --- the calendar -------------------------------------------------------------------------


def test_a_calendar_reads_times_multipliers_replicas_and_leads():
    c = cal.parse(GOOD)
    sale, stream = sorted(c.promotions, key=lambda p: p.name)
    assert sale.start == datetime(2026, 11, 11, 20, tzinfo=TZ) and sale.multiplier == 5.0 and sale.replicas is None
    assert sale.lead == timedelta(minutes=10)
    assert stream.replicas == 6 and stream.multiplier is None and stream.lead == timedelta(minutes=20)
    assert [p.name for p in c.promotions] == ["live stream", "flash sale"], "by start (04:00Z is 12:00+08:00)"


def test_a_promotion_asks_from_its_lead_and_warmup_until_its_end():
    c = cal.parse(GOOD)
    start = datetime(2026, 11, 11, 20, tzinfo=TZ)
    warmup = timedelta(seconds=60)
    assert [p.name for p in c.active(start - timedelta(minutes=11), warmup)] == ["flash sale"]
    assert c.active(start - timedelta(minutes=11, seconds=1), warmup) == []
    assert [p.name for p in c.active(start + timedelta(minutes=29), warmup)] == ["flash sale"]
    assert c.active(start + timedelta(minutes=30), warmup) == []
    with pytest.raises(ValueError, match="UTC offset"):
        c.active(datetime(2026, 11, 11, 20))


def test_the_example_calendar_is_valid():
    names = [p.name for p in cal.load(EXAMPLE).promotions]
    assert names == ["opening", "flash sale"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("lead_minutes = 10\n[[promotion]\n", "not TOML"),
        ("leed_minutes = 10\n", "unknown key 'leed_minutes'"),
        ("lead_minutes = -5\n", "lead_minutes: minutes in"),
        ("promotion = 3\n", r"promotion: write each one as a \[\[promotion\]\] table"),
        ("[[promotion]]\nstart = 2026-11-11T20:00:00Z\n", "promotion 1: name: a non-empty string"),
        (
            '[[promotion]]\nname = "x"\nend = 2026-11-11T20:00:00Z\nreplicas = 2\n',
            r"promotion 1 \(x\): start is required",
        ),
        (
            '[[promotion]]\nname = "x"\nstart = "2026-11-11 20:00"\nend = 2026-11-11T21:00:00Z\nreplicas = 2\n',
            r"\(x\): start: a TOML date-time is required \(unquoted\)",
        ),
        (
            '[[promotion]]\nname = "x"\nstart = 2026-11-11T20:00:00\nend = 2026-11-11T21:00:00Z\nreplicas = 2\n',
            r"\(x\): start: give a UTC offset",
        ),
        (
            '[[promotion]]\nname = "x"\nstart = 2026-11-11T20:00:00Z\nend = 2026-11-11T19:00:00Z\nreplicas = 2\n',
            r"\(x\): end .* is not after start",
        ),
        (
            '[[promotion]]\nname = "x"\nstart = 2026-11-11T20:00:00Z\nend = 2026-11-11T21:00:00Z\n',
            "give exactly one of multiplier",
        ),
        (
            '[[promotion]]\nname = "x"\nstart = 2026-11-11T20:00:00Z\nend = 2026-11-11T21:00:00Z\n'
            "replicas = 2\nmultiplier = 3\n",
            "give exactly one of multiplier",
        ),
        (
            '[[promotion]]\nname = "x"\nstart = 2026-11-11T20:00:00Z\nend = 2026-11-11T21:00:00Z\nmultiplier = 0\n',
            r"\(x\): multiplier: a number in \(0, 100\]",
        ),
        (
            '[[promotion]]\nname = "x"\nstart = 2026-11-11T20:00:00Z\nend = 2026-11-11T21:00:00Z\nreplicas = 2.5\n',
            r"\(x\): replicas: a whole number >= 1",
        ),
        (
            '[[promotion]]\nname = "x"\nstart = 2026-11-11T20:00:00Z\nend = 2026-11-11T21:00:00Z\nreplicas = 2\n'
            "multipler = 3\n",
            r"\(x\): unknown field 'multipler'",
        ),
        (
            '[[promotion]]\nname = "x"\nstart = 2026-11-11T20:00:00Z\nend = 2026-11-11T21:00:00Z\nreplicas = 2\n'
            '[[promotion]]\nname = "x"\nstart = 2026-11-12T20:00:00Z\nend = 2026-11-12T21:00:00Z\nreplicas = 2\n',
            "name 'x' is used twice",
        ),
    ],
)
def test_a_bad_calendar_is_refused_naming_the_field(text, message):
    with pytest.raises(cal.CalendarError, match=message) as e:
        cal.parse(text, "promotions.toml")
    assert str(e.value).startswith("promotions.toml: ")


def test_a_missing_calendar_file_is_a_calendar_error(tmp_path):
    with pytest.raises(cal.CalendarError, match="cannot read the calendar"):
        cal.load(tmp_path / "none.toml")


# --- the forecast -------------------------------------------------------------------------


def test_the_forecast_is_last_weeks_horizon_times_the_trend():
    recent = [12.0] * 30  # 1.2x the same half hour last week
    last_week = [10.0] * 30 + [10.0, 20.0, 15.0]
    f = fc.forecast(recent, last_week)
    assert f.source == "last-week x trend" and f.trend == pytest.approx(1.2) and f.rate == pytest.approx(24.0)


def test_the_forecast_leaves_gaps_out_and_clamps_the_trend():
    assert fc.forecast([None, 10.0, float("nan")], [5.0, 5.0, 5.0, 8.0]).rate == pytest.approx(16.0)
    assert fc.forecast([100.0] * 3, [1.0] * 3 + [1.0]).trend == fc.TREND_BOUNDS[1]


def test_without_last_week_the_forecast_is_the_recent_peak_and_without_data_none():
    f = fc.forecast([3.0, 9.0, 4.0], [None] * 5)
    assert (f.rate, f.source) == (9.0, "recent")
    assert fc.forecast([None] * 3, [None] * 5) is None
    with pytest.raises(ValueError, match="fewer than recent"):
        fc.forecast([1.0] * 3, [1.0])


def _history(rates: dict, now):
    return fc.SeriesHistory(rates, lambda: now)


def test_ahead_reads_the_history_and_never_the_future():
    t0 = datetime(2026, 11, 11, 19, tzinfo=TZ)
    rates = {}
    for k in range(-90, 90):
        t = t0 + timedelta(minutes=k)
        rates[t - fc.WEEK] = 100.0 if k >= 5 else 50.0  # last week's 19:05 jump
        rates[t] = 60.0 if k < 0 else 1000.0  # today: 1.2x until now, then a future the forecast may not see
    f = fc.ahead(_history(rates, t0), t0, horizon_min=10)
    assert f.trend == pytest.approx(1.2) and f.rate == pytest.approx(120.0)


def test_a_promotion_is_no_trend():
    t0 = datetime(2026, 11, 11, 20, 40, tzinfo=TZ)
    rates = {}
    for k in range(-60, 30):
        t = t0 + timedelta(minutes=k)
        rates[t - fc.WEEK] = 100.0
        rates[t] = 500.0 if k < -10 else 110.0  # a promotion until 20:30
    promo = [(t0 - timedelta(minutes=40), t0 - timedelta(minutes=10))]
    assert fc.ahead(_history(rates, t0), t0, 10).trend > 3
    assert fc.ahead(_history(rates, t0), t0, 10, exclude=promo).trend == pytest.approx(1.1)


def test_a_promotions_baseline_is_its_window_last_week_times_the_trend_before_it():
    start = datetime(2026, 11, 11, 20, tzinfo=TZ)
    rates = {}
    for k in range(-60, 30):
        t = start + timedelta(minutes=k)
        rates[t - fc.WEEK] = 80.0 if k < 0 else 100.0
        rates[t] = 120.0 if k < -11 else 600.0
    b = fc.baseline(
        _history(rates, start + timedelta(minutes=5)),
        start,
        start + timedelta(minutes=30),
        start - timedelta(minutes=11),
    )
    assert b.trend == pytest.approx(1.5) and b.rate == pytest.approx(150.0)


def test_a_recorded_series_loads_and_a_bad_one_names_its_line(tmp_path):
    path = tmp_path / "series.csv"
    path.write_text("minute,chats_per_s\n2026-11-11T20:00:00+08:00,12.5\n")
    h = fc.SeriesHistory.load(path, lambda: datetime(2026, 11, 11, 20, 1, tzinfo=TZ))
    assert h.rates(datetime(2026, 11, 11, 20, tzinfo=TZ), 2) == [12.5, None]
    path.write_text("minute,chats_per_s\n2026-11-11T20:00:00+08:00,lots\n")
    with pytest.raises(ValueError, match="line 2"):
        fc.SeriesHistory.load(path, lambda: None)


# --- the plan -----------------------------------------------------------------------------


def test_replicas_for_a_rate_keep_the_headroom():
    s = Sizing(per_replica=50.0, headroom=1.25)
    assert s.replicas_for(40.0) == 1 and s.replicas_for(40.1) == 2 and s.replicas_for(400.0) == 10


@pytest.mark.parametrize(
    "kwargs, message",
    [({"per_replica": 0}, "per_replica"), ({"headroom": 0.9}, "headroom"), ({"floor": 5, "ceiling": 4}, "floor")],
)
def test_bad_sizing_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Sizing(**kwargs)


def test_the_plan_is_the_largest_ask_capped_at_the_ceiling():
    c = cal.parse(GOOD)
    s = Sizing(per_replica=50.0, headroom=1.0, floor=2, ceiling=12, warmup_s=0)
    quiet = datetime(2026, 11, 11, 3, tzinfo=TZ)
    assert plan(quiet, c, None, s).desired == 2
    f = fc.Forecast(160.0, 1.0, "last-week x trend")
    p = plan(quiet, c, f, s)
    assert (p.desired, p.components) == (4, {"floor": 2, "forecast": 4})
    before_sale = datetime(2026, 11, 11, 19, 55, tzinfo=TZ)
    p = plan(before_sale, c, f, s, {"flash sale": 100.0})
    assert p.components["calendar"] == 10 and p.desired == 10 and p.promotions == ("flash sale",)
    assert plan(before_sale, c, f, s, {"flash sale": 1000.0}).desired == 12, "the ceiling"
    assert plan(before_sale, c, f, s).components.keys() == {"floor", "forecast"}, "no baseline: no ask"
    stream = datetime(2026, 11, 11, 3, 45, tzinfo=timezone.utc)
    assert plan(stream, c, None, s).components["calendar"] == 6


def test_the_defaults_are_the_hpas_limits():
    spec, s = _hpa_spec(), Sizing()
    assert (s.floor, s.ceiling) == (spec.min_replicas, spec.max_replicas)


# --- the HPA ------------------------------------------------------------------------------


def test_the_hpa_spec_is_read_from_the_manifest():
    spec = _hpa_spec()
    assert spec.up.window_s == 0 and spec.down.window_s == 300
    assert {(p.kind, p.value, p.period_s) for p in spec.up.policies} == {("Percent", 100, 15.0), ("Pods", 4, 15.0)}


def test_a_pods_metric_counts_starting_pods_at_zero_up_and_at_target_down():
    assert pods_metric_replicas(4, 4, 1.05) == 4, "inside the tolerance"
    assert pods_metric_replicas(4, 4, 2.0) == 8
    assert pods_metric_replicas(8, 4, 2.0) == 8, "four pods still starting: 4 x 2 over 8 is 1.0"
    assert pods_metric_replicas(8, 4, 1.5) == 8, "the pods starting turn it round: no change"
    assert pods_metric_replicas(4, 4, 0.5) == 2
    assert pods_metric_replicas(6, 4, 0.5) == 4, "two starting pods count at the target"
    assert pods_metric_replicas(4, 0, 5.0) == 4, "nothing reports: no change"


def test_an_external_average_value_metric_asks_for_its_value():
    assert external_average_replicas(2, 10, 1.0) == 10
    assert external_average_replicas(10, 10.5, 1.0) == 10, "inside the 10% tolerance"
    assert external_average_replicas(10, 12, 1.0) == 12


def test_scale_up_follows_the_manifests_policies():
    hpa, current, seen = Hpa(_hpa_spec()), 2, []
    for k in range(4):
        current = hpa.sync(15.0 * k, current, [40])
        seen.append(current)
    assert seen == [6, 12, 12, 12], "+4 pods beats +100% from 2, then +100% beats +4; maxReplicas 12"


def test_scale_down_waits_out_the_window_then_one_pod_a_minute():
    hpa, current, seen = Hpa(_hpa_spec()), 10, {}
    for k in range(0, 60):
        current = hpa.sync(15.0 * k, current, [10 if k == 0 else 2])
        seen[15 * k] = current
    assert seen[285] == 10, "the 5-minute window holds the highest recommendation"
    assert seen[300] == 9 and seen[345] == 9 and seen[360] == 8
    assert min(seen.values()) >= 2


def test_percent_and_min_select_policies():
    spec = Spec(1, 100, Rules(0, (Policy("Percent", 50, 60),)), Rules(0, (Policy("Percent", 50, 60),), "Max"))
    hpa = Hpa(spec)
    assert hpa.sync(0, 10, [100]) == 15
    assert hpa.sync(15, 15, [100]) == 15, "the period's +50% is spent"
    assert Hpa(spec).sync(0, 10, [1]) == 5


# --- the simulated day --------------------------------------------------------------------


def test_the_recorded_day_is_deterministic_and_shaped():
    a, b = simulate.recorded_day(), simulate.recorded_day()
    assert a == b
    day = simulate.DAY
    sale = a.rate_at(day + timedelta(hours=20))
    before = a.rate_at(day + timedelta(hours=19, minutes=59))
    assert 4.0 < sale / before < 6.5, "the 5x flash sale, on noise"
    last_week = a.rate_at(day + timedelta(hours=20) - fc.WEEK)
    assert 1.2 < before / last_week < 1.45, "this week's growth"


@pytest.fixture(scope="module")
def flash_sale():
    """The flash sale (19:00-21:00) under the reactive HPA alone and with the plan."""
    c = cal.load(EXAMPLE)
    day, spec, settings = simulate.recorded_day(), _hpa_spec(), simulate.Settings()
    start, end = simulate.DAY + timedelta(hours=19), simulate.DAY + timedelta(hours=21)
    traces = {
        "reactive": simulate.Simulation(day, spec, settings, None).run(start, end),
        "planned": simulate.Simulation(day, spec, settings, c).run(start, end),
    }
    [sale] = [p for p in c.promotions if p.name == "flash sale"]
    c_sale = cal.Calendar((sale,))
    return {k: simulate.peaks(t, c_sale, settings.per_replica)[0] for k, t in traces.items()}, traces


def test_pre_scaled_pods_are_ready_the_lead_before_the_peak(flash_sale):
    peaks, _ = flash_sale
    assert peaks["planned"].lead_min >= 10.0, peaks["planned"]
    assert peaks["reactive"].lead_min is not None and peaks["reactive"].lead_min < 0, "the HPA reacts after it"


def test_the_faq_share_at_the_peak_falls_against_the_reactive_hpa(flash_sale):
    peaks, _ = flash_sale
    assert peaks["reactive"].faq_busiest_minute > 0.1
    assert peaks["planned"].faq_busiest_minute < peaks["reactive"].faq_busiest_minute
    assert peaks["planned"].faq_first_10min < peaks["reactive"].faq_first_10min


def test_the_simulated_deployment_stays_in_the_hpas_limits(flash_sale):
    _, traces = flash_sale
    spec = _hpa_spec()
    for trace in traces.values():
        assert all(spec.min_replicas <= r <= spec.max_replicas for r in trace.replicas)
        assert all(ready <= r for ready, r in zip(trace.ready, trace.replicas))
        assert all(0 <= f <= d for f, d in zip(trace.faq, trace.demand))


def test_the_table_has_a_row_per_policy_and_promotion():
    c = cal.load(EXAMPLE)
    trace = simulate.Trace(
        t=[simulate.DAY + timedelta(hours=20, seconds=5 * k) for k in range(12)],
        demand=[100.0] * 12,
        replicas=[2] * 12,
        ready=[2] * 12,
        faq=[0.0] * 12,
        planned=[0] * 12,
    )
    s = simulate.summarize("x", trace, c, 58.0, simulate.DAY, simulate.DAY + timedelta(days=1))
    text = simulate.table([s])
    assert text.count("\n") == 3 and "| x | flash sale (20:00) |" in text


# --- the exporter -------------------------------------------------------------------------


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_the_exposition_parses_and_carries_the_plan():
    c = cal.parse(GOOD)
    p = plan(
        datetime(2026, 11, 11, 19, 55, tzinfo=TZ),
        c,
        fc.Forecast(160.0, 1.0, "x"),
        Sizing(50.0, 1.0, warmup_s=0),
        {"flash sale": 100.0},
    )
    families = _families(exposition(p, c, True))
    assert families[DESIRED].samples[0].value == 10
    sources = {s.labels["source"]: s.value for s in families["switchboard_capacity_component_replicas"].samples}
    assert sources == {"floor": 2, "forecast": 4, "calendar": 10}
    active = {s.labels["promotion"]: s.value for s in families["switchboard_capacity_promotion_active"].samples}
    assert active == {"flash sale": 1, "live stream": 0}
    assert families["switchboard_capacity_history_up"].samples[0].value == 1


def test_a_promotion_name_is_escaped_in_its_label():
    name = 'name = "say \\"hi\\"\\\\"'
    c = cal.parse(f"[[promotion]]\n{name}\nstart = 2026-11-11T20:00:00Z\nend = 2026-11-11T21:00:00Z\nreplicas = 3\n")
    p = plan(datetime(2026, 11, 11, 20, 5, tzinfo=timezone.utc), c, None, Sizing(warmup_s=0))
    [sample] = _families(exposition(p, c, False))["switchboard_capacity_promotion_active"].samples
    assert sample.labels["promotion"] == 'say "hi"\\' and sample.value == 1


class _DownHistory:
    def rates(self, start, minutes):
        from switchboard.ops.capacity.exporter import HistoryError

        raise HistoryError("prometheus:9090: connection refused")


def test_without_history_the_planner_keeps_the_floor_and_the_calendars_counts():
    c = cal.parse(GOOD)
    planner = Planner(c, Sizing(50.0, 1.0, warmup_s=0), _DownHistory())
    p = planner.at(datetime(2026, 11, 11, 3, 45, tzinfo=timezone.utc))
    assert p.desired == 6 and not planner.history_up and p.forecast is None
    p = planner.at(datetime(2026, 11, 11, 19, 55, tzinfo=TZ))
    assert p.desired == 2, "a multiplier without a baseline asks for nothing"
    fallback = Planner(c, Sizing(50.0, 1.0, warmup_s=0), _DownHistory(), baseline=100.0)
    assert fallback.at(datetime(2026, 11, 11, 19, 55, tzinfo=TZ)).desired == 10


def test_the_planner_over_a_recorded_series_plans_the_sale_ahead(tmp_path):
    day = simulate.recorded_day()
    path = tmp_path / "series.csv"
    day.write_csv(path)
    at = simulate.DAY + timedelta(hours=19, minutes=49)
    history = fc.SeriesHistory.load(path, lambda: at)
    p = Planner(cal.load(EXAMPLE), Sizing(), history).at(at)
    assert p.promotions == ("flash sale",) and p.desired == 12
    assert p.forecast.source == "last-week x trend" and math.isclose(p.forecast.trend, 1.3, abs_tol=0.05)


class _CountingHistory:
    def __init__(self, fail: Exception | None = None):
        self.calls, self.fail = 0, fail

    def rates(self, start, minutes):
        self.calls += 1
        if self.fail:
            raise self.fail
        return [None] * minutes


def _get(port: int, path: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_exporter_serves_the_plan_once_per_refresh_and_its_health():
    from switchboard.ops.capacity.exporter import Exporter

    history = _CountingHistory()
    planner = Planner(cal.parse(GOOD), Sizing(warmup_s=0), history)
    exporter = Exporter(planner, 0, "127.0.0.1", refresh_s=3600, clock=lambda: datetime(2026, 11, 11, 3, tzinfo=TZ))
    exporter.start()
    try:
        status, body = _get(exporter.port, "/metrics")
        assert status == 200 and _families(body)[DESIRED].samples[0].value == 2
        calls = history.calls
        assert _get(exporter.port, "/metrics")[1] == body and history.calls == calls, "cached for refresh_s"
        assert _get(exporter.port, "/healthz") == (200, "ok\n")
        assert _get(exporter.port, "/nothing")[0] == 404
    finally:
        exporter.stop()


def test_a_plan_that_fails_is_a_500_and_the_exporter_goes_on(caplog):
    from switchboard.ops.capacity.exporter import Exporter

    planner = Planner(cal.parse(GOOD), Sizing(warmup_s=0), _CountingHistory(fail=KeyError("data")))
    exporter = Exporter(planner, 0, "127.0.0.1", clock=lambda: datetime(2026, 11, 11, 3, tzinfo=TZ)).start()
    try:
        status, body = _get(exporter.port, "/metrics")
        assert status == 500 and "the plan failed" in body and "KeyError" not in body
        assert "the plan failed" in caplog.text
        assert _get(exporter.port, "/healthz")[0] == 200
    finally:
        exporter.stop()


def test_a_recorded_day_replays_from_its_csv(tmp_path):
    day = simulate.recorded_day()
    path = tmp_path / "series.csv"
    day.write_csv(path)
    assert simulate.Day.from_csv(path) == day


@pytest.mark.parametrize(
    "rows, message",
    [
        ("", "no rows"),
        ("2026-11-11T20:00:00+08:00,x\n", "line 2: minute,chats_per_s expected"),
        ("2026-11-11T20:00:00,1\n", "line 2: .* has no UTC offset"),
        ("2026-11-11T20:00:00+08:00,1\n2026-11-11T20:02:00+08:00,1\n", "line 3: .* does not follow"),
        ("2026-11-11T20:00:00+08:00,-1\n", "line 2: a rate >= 0"),
    ],
)
def test_a_bad_recorded_series_names_its_line(tmp_path, rows, message):
    path = tmp_path / "series.csv"
    path.write_text("minute,chats_per_s\n" + rows)
    with pytest.raises(ValueError, match=message):
        simulate.Day.from_csv(path)


def test_a_series_too_short_for_the_calendars_day_is_refused():
    short = simulate.Day(simulate.DAY - timedelta(days=1), (1.0,) * 60)
    with pytest.raises(ValueError, match="simulating 2026-11-11 needs 2026-11-03T21:30:00"):
        simulate.compare(cal.load(EXAMPLE), _hpa_spec(), simulate.Settings(), short)
