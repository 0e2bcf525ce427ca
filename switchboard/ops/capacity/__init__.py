"""Capacity before the burst (issue 68, point 6): the replicas a promotion calendar and a
forecast from recent traffic ask for, ahead of the load, as one desired replica count.

- ``calendar``: the promotion calendar file (TOML), validated.
- ``forecast``: the next minutes' chat rate from the same minutes last week times the recent trend.
- ``plan``: desired replicas = max(calendar, forecast, floor), capped at a ceiling.
- ``hpa``: Kubernetes' HPA algorithm (autoscaling/v2, behaviors), for the simulator.
- ``simulate``: a Double-11-shaped day, reactive HPA alone against calendar + forecast + HPA.
- ``exporter``: the plan as a Prometheus gauge the HPA reads as an External metric.

``python -m switchboard.ops.capacity --help``; docs/capacity.md. Imports without Triton.
"""
