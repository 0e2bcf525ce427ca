"""Kubernetes' HorizontalPodAutoscaler (autoscaling/v2) as the controller computes it, for the
simulator: each metric's desired replicas with the 10% tolerance, the largest of them, the
stabilization windows, then the behavior's rate policies. Follows
pkg/controller/podautoscaler/horizontal.go (``stabilizeRecommendationWithBehaviors``,
``convertDesiredReplicasWithBehaviorRate``, ``calculateScaleUpLimitWithScalingRules``,
``calculateScaleDownLimitWithBehaviors``); the parameters are read from deploy/k8s/hpa.yaml.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

TOLERANCE = 0.1  # --horizontal-pod-autoscaler-tolerance's default
SYNC_S = 15.0  # --horizontal-pod-autoscaler-sync-period's default


@dataclass(frozen=True)
class Policy:
    kind: str  # "Pods" or "Percent"
    value: int
    period_s: float


@dataclass(frozen=True)
class Rules:
    window_s: float
    policies: tuple[Policy, ...]
    select: str = "Max"  # Max, Min or Disabled


@dataclass(frozen=True)
class Spec:
    min_replicas: int
    max_replicas: int
    up: Rules
    down: Rules

    @classmethod
    def from_manifest(cls, hpa: dict) -> Spec:
        """From a HorizontalPodAutoscaler object (deploy/k8s/hpa.yaml)."""
        spec = hpa["spec"]

        def rules(d: dict, default_window: float) -> Rules:
            policies = tuple(Policy(p["type"], int(p["value"]), float(p["periodSeconds"])) for p in d["policies"])
            return Rules(
                float(d.get("stabilizationWindowSeconds", default_window)), policies, d.get("selectPolicy", "Max")
            )

        behavior = spec["behavior"]
        return cls(
            int(spec.get("minReplicas", 1)),
            int(spec["maxReplicas"]),
            rules(behavior["scaleUp"], 0),
            rules(behavior["scaleDown"], 300),
        )


def pods_metric_replicas(current: int, ready: int, ratio: float, tolerance: float = TOLERANCE) -> int:
    """A Pods metric's desired replicas. ``ratio``: the metric's average over the ``ready`` pods
    that report it, divided by its target. Pods still starting report nothing: the controller
    counts them at 0 when the ratio asks for more pods and at the target when it asks for
    fewer, and keeps ``current`` when that turns the direction round or lands in the tolerance.
    No pod reporting: no change."""
    if ready <= 0 or current <= 0:
        return current
    if abs(ratio - 1.0) <= tolerance:
        return current
    missing = max(0, current - ready)
    if ratio > 1:
        adjusted = ratio * ready / current
    else:
        adjusted = (ratio * ready + missing) / current
    if abs(adjusted - 1.0) <= tolerance or (ratio > 1) != (adjusted > 1):
        return current
    return math.ceil(adjusted * current)


def external_average_replicas(current: int, value: float, target: float, tolerance: float = TOLERANCE) -> int:
    """An External metric with an AverageValue target: ceil(value / target), independent of
    the current count (so a gauge of desired replicas with target 1 asks for itself)."""
    if current and abs(value / (target * current) - 1.0) <= tolerance:
        return current
    return math.ceil(value / target)


class Hpa:
    """One HPA's state across syncs: its recommendations and its scale events."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self.recommendations: list[tuple[float, int]] = []
        self.events: list[tuple[float, int]] = []  # (time, +added or -removed)

    def sync(self, t: float, current: int, metric_replicas: Iterable[int]) -> int:
        """The Deployment's new replica count at ``t``, given each metric's desired replicas."""
        asked = list(metric_replicas)
        desired = max(asked) if asked else current
        desired = self._stabilize(t, current, desired)
        new = self._limit(t, current, desired)
        new = min(self.spec.max_replicas, max(self.spec.min_replicas, new))
        if new != current:
            self.events.append((t, new - current))
        horizon = max(self.spec.up.window_s, self.spec.down.window_s, *self._periods())
        self.recommendations = [(s, r) for s, r in self.recommendations if s > t - horizon]
        self.events = [(s, d) for s, d in self.events if s > t - max(self._periods(), default=0)]
        return new

    def _periods(self) -> list[float]:
        return [p.period_s for p in (*self.spec.up.policies, *self.spec.down.policies)]

    def _stabilize(self, t: float, current: int, desired: int) -> int:
        up = down = desired
        for s, r in self.recommendations:
            if s > t - self.spec.up.window_s:
                up = min(up, r)
            if s > t - self.spec.down.window_s:
                down = max(down, r)
        self.recommendations.append((t, desired))
        out = current
        if out < up:
            out = up
        if out > down:
            out = down
        return out

    def _changed(self, t: float, period_s: float, sign: int) -> int:
        return sum(abs(d) for s, d in self.events if s > t - period_s and (d > 0) == (sign > 0))

    def _limit(self, t: float, current: int, desired: int) -> int:
        spec = self.spec
        if desired > current:
            rules = spec.up
            if rules.select == "Disabled":
                return current
            pick = max if rules.select == "Max" else min
            limit = None
            for p in rules.policies:
                start = current - self._changed(t, p.period_s, +1) + self._changed(t, p.period_s, -1)
                proposed = start + p.value if p.kind == "Pods" else math.ceil(start * (1 + p.value / 100))
                limit = proposed if limit is None else pick(limit, proposed)
            limit = max(current, limit if limit is not None else desired)
            return min(desired, limit, spec.max_replicas)
        if desired < current:
            rules = spec.down
            if rules.select == "Disabled":
                return current
            pick = max if rules.select == "Min" else min  # the smallest change down is the largest count
            limit = None
            for p in rules.policies:
                start = current - self._changed(t, p.period_s, +1) + self._changed(t, p.period_s, -1)
                proposed = start - p.value if p.kind == "Pods" else int(start * (1 - p.value / 100))
                limit = proposed if limit is None else pick(limit, proposed)
            limit = min(current, limit if limit is not None else desired)
            return max(desired, limit, spec.min_replicas)
        return desired
