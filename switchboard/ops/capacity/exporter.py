"""The capacity plan as Prometheus gauges, for the HPA's External metric (deploy/k8s/hpa.yaml,
through prometheus-adapter's ``externalRules``): ``python -m switchboard.ops.capacity serve``.

Each scrape of ``/metrics`` evaluates the plan (at most once per ``refresh_s``): the calendar,
and the forecast from Prometheus' record of the chat rate (``PrometheusHistory``: range queries
of ``DEMAND_QUERY``, per minute, now and a week ago). When Prometheus cannot be read the
forecast is left out, promotions with a multiplier fall back to ``--baseline-chats-per-s`` (or
ask for nothing), and ``switchboard_capacity_history_up`` reads 0; the gauge is still served, so
the HPA keeps its floor and the calendar's fixed replica counts.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from switchboard.ops.capacity import forecast as fc
from switchboard.ops.capacity.calendar import Calendar
from switchboard.ops.capacity.plan import Plan, Sizing, plan

log = logging.getLogger("switchboard.capacity")

DESIRED = "switchboard_capacity_desired_replicas"
# Every chat that arrived (FAQ answers and refusals included): the demand, not what was served.
DEMAND_QUERY = "sum(rate(switchboard_chat_requests_total[1m]))"


class HistoryError(RuntimeError):
    """The traffic history could not be read."""


class PrometheusHistory:
    """``forecast.History`` from a Prometheus server's range queries, one sample a minute (the
    sample at the end of a minute is that minute's rate)."""

    def __init__(self, url: str, query: str = DEMAND_QUERY, timeout_s: float = 10.0):
        self.url, self.query, self.timeout_s = url.rstrip("/"), query, timeout_s

    def rates(self, start: datetime, minutes: int) -> list[float | None]:
        if minutes <= 0:
            return []
        first = start.timestamp() + 60
        params = {"query": self.query, "start": first, "end": first + 60 * (minutes - 1), "step": "60"}
        url = f"{self.url}/api/v1/query_range?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as r:
                body = json.load(r)
        except (OSError, ValueError) as e:
            raise HistoryError(f"{self.url}: {e}") from e
        if body.get("status") != "success":
            raise HistoryError(f"{self.url}: {body.get('error', body)}")
        out: list[float | None] = [None] * minutes
        try:
            for series in body["data"]["result"][:1]:
                for ts, value in series["values"]:
                    i = round((float(ts) - first) / 60)
                    if 0 <= i < minutes and value not in ("NaN", "+Inf", "-Inf"):
                        out[i] = float(value)
        except (KeyError, TypeError, ValueError) as e:
            raise HistoryError(f"{self.url}: not a range query's answer ({e!r})") from e
        return out


class Planner:
    """The plan at a time, from a calendar, a history (or none) and the sizing."""

    def __init__(self, calendar: Calendar, sizing: Sizing, history=None, baseline: float | None = None):
        self.calendar, self.sizing, self.history, self.baseline = calendar, sizing, history, baseline
        self.history_up = history is not None

    def horizon_min(self) -> int:
        lead = max((p.lead for p in self.calendar.promotions), default=timedelta(minutes=10))
        return max(1, int((lead.total_seconds() + self.sizing.warmup_s + 59) // 60))

    def at(self, t: datetime) -> Plan:
        ahead, baselines = None, {}
        active = self.calendar.active(t, self.sizing.warmup)
        if self.history is not None:
            try:
                ahead = fc.ahead(self.history, t, self.horizon_min(), exclude=self.calendar.windows())
                for p in active:
                    b = fc.baseline(self.history, p.start, p.end, p.asks_from(self.sizing.warmup))
                    baselines[p.name] = b.rate if b else None
                self.history_up = True
            except HistoryError as e:
                log.warning("traffic history unavailable, planning without the forecast: %s", e)
                self.history_up, ahead, baselines = False, None, {}
        for p in active:
            if baselines.get(p.name) is None and p.multiplier is not None:
                baselines[p.name] = self.baseline
                if self.baseline is None:
                    log.warning("promotion %r: no baseline to multiply (no history, no --baseline-chats-per-s)", p.name)
        return plan(t, self.calendar, ahead, self.sizing, baselines)


def _label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def exposition(p: Plan, calendar: Calendar, history_up: bool) -> str:
    """The Prometheus text exposition of a plan."""
    active = set(p.promotions)
    lines = [
        f"# HELP {DESIRED} replicas the capacity plan wants now: max(calendar, forecast, floor) capped at the ceiling",
        f"# TYPE {DESIRED} gauge",
        f"{DESIRED} {p.desired}",
        "# HELP switchboard_capacity_component_replicas replicas each source of the plan asks for",
        "# TYPE switchboard_capacity_component_replicas gauge",
        *(f'switchboard_capacity_component_replicas{{source="{k}"}} {v}' for k, v in p.components.items()),
        "# HELP switchboard_capacity_forecast_chats_per_second the chat rate forecast over the lead (no headroom)",
        "# TYPE switchboard_capacity_forecast_chats_per_second gauge",
    ]
    if p.forecast is not None:
        lines.append(f"switchboard_capacity_forecast_chats_per_second {p.forecast.rate:.6g}")
    lines += [
        "# HELP switchboard_capacity_promotion_active 1 while a calendar promotion asks for its replicas",
        "# TYPE switchboard_capacity_promotion_active gauge",
        *(
            f'switchboard_capacity_promotion_active{{promotion="{_label(c.name)}"}} {int(c.name in active)}'
            for c in calendar.promotions
        ),
        "# HELP switchboard_capacity_history_up 1 when the traffic history (Prometheus) answered the last plan",
        "# TYPE switchboard_capacity_history_up gauge",
        f"switchboard_capacity_history_up {int(history_up)}",
    ]
    return "\n".join(lines) + "\n"


class Exporter:
    """``/metrics`` (the plan), ``/healthz`` on ``port``; the plan cached ``refresh_s``."""

    def __init__(self, planner: Planner, port: int, host: str = "0.0.0.0", refresh_s: float = 15.0, clock=None):
        self.planner, self.refresh_s = planner, refresh_s
        self.clock = clock or (lambda: datetime.now(timezone.utc))
        self._lock = threading.Lock()
        self._cached: tuple[float, str] | None = None
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                if self.path == "/metrics":
                    try:
                        body, kind = exporter.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8"
                    except Exception:  # a scrape gets a 500 (the HPA holds), the log the traceback
                        log.exception("the plan failed")
                        self.send_error(500, "the plan failed: see the planner's log")
                        return
                elif self.path == "/healthz":
                    body, kind = b"ok\n", "text/plain"
                else:
                    self.send_error(404, "only /metrics and /healthz")
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format, *args):  # noqa: A002 (http.server's name)
                log.debug(format, *args)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def metrics(self) -> str:
        with self._lock:
            if self._cached is None or time.monotonic() - self._cached[0] >= self.refresh_s:
                p = self.planner.at(self.clock())
                text = exposition(p, self.planner.calendar, self.planner.history_up)
                self._cached = (time.monotonic(), text)
                log.info("plan: %s; promotions asking: %s", p.reason(), ", ".join(p.promotions) or "none")
            return self._cached[1]

    def start(self) -> Exporter:
        self.thread = threading.Thread(target=self.server.serve_forever, name="capacity-exporter", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self.thread is not None:
            self.thread.join(timeout=5)
