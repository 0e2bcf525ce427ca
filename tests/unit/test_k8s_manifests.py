"""deploy/k8s against the Kubernetes API schemas (kubernetes-validate, offline, strict) and
against the code it runs: the supervisor's command line and probe endpoints, the metric names
the server exports, Redis as `make serve` starts it, the local balancer's session stickiness."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
import types

import kubernetes_validate
import pytest
import yaml

from switchboard import paths
from switchboard.asr.metrics import METRICS as ASR_METRICS
from switchboard.asr.metrics import PREFIX as ASR_PREFIX
from switchboard.asr.metrics import AsrMetrics
from switchboard.ops import launch
from switchboard.ops.balancer import Replica, haproxy_config
from switchboard.ops.health_server import LIVENESS_PATH, READINESS_PATH
from switchboard.ops.supervisor import parser
from switchboard.serving.metrics import METRICS, PREFIX
from switchboard.wire import SESSION_HEADER

# The oldest and newest Kubernetes the manifests are checked against (kubernetes-validate 1.37.0
# carries the schemas); autoscaling/v2 behavior, policy/v1 and h2c appProtocol are in both.
K8S_VERSIONS = ("1.30.0", "1.37.0")
KUSTOMIZATIONS = (paths.K8S, paths.K8S / "monitoring")
ADAPTER = paths.K8S / "monitoring" / "prometheus-adapter.yaml"
SCRAPE = paths.K8S / "monitoring" / "prometheus-scrape.yml"


def _docs(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _kustomization(folder):
    return yaml.safe_load((folder / "kustomization.yaml").read_text())


def _resources():
    """(file, document) of every object the kustomizations apply."""
    return [
        (folder / name, doc)
        for folder in KUSTOMIZATIONS
        for name in _kustomization(folder)["resources"]
        for doc in _docs(folder / name)
    ]


def _objects(kind):
    return {doc["metadata"]["name"]: doc for _, doc in _resources() if doc["kind"] == kind}


def _container(deployment="switchboard", name=None):
    containers = _objects("Deployment")[deployment]["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if name is None or c["name"] == name)


def _container_args():
    return parser().parse_args(_container()["args"])


def _ports(container):
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def _matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(
    "where", [f"{f.relative_to(paths.K8S)}:{d['kind']}/{d['metadata']['name']}" for f, d in _resources()]
)
def test_every_object_is_valid_for_kubernetes(where, version):
    doc = next(d for f, d in _resources() if f"{f.relative_to(paths.K8S)}:{d['kind']}/{d['metadata']['name']}" == where)
    kubernetes_validate.validate(doc, version, strict=True)


def _set(doc, path, value):
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


@pytest.mark.parametrize(
    "path, value",
    [
        (["spec", "template", "spec", "containers", 0, "readinessProbe", "httpGet", "paht"], "/readyz"),
        (["spec", "replicas"], "two"),
        (["spec", "template", "spec", "containers", 0, "ports", 0, "containerPort"], "grpc"),
        (["spec", "template", "spec", "terminationGracePeriod"], 60),
    ],
)
def test_a_broken_manifest_is_rejected(path, value):
    broken = copy.deepcopy(_objects("Deployment")["switchboard"])
    _set(broken, path, value)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("folder", KUSTOMIZATIONS, ids=lambda f: str(f.relative_to(paths.ROOT)))
def test_the_kustomization_lists_every_manifest_in_its_folder(folder):
    listed = _kustomization(folder)["resources"]
    objects = sorted(
        p.name
        for p in [*folder.glob("*.yaml"), *folder.glob("*.yml")]
        if p.name != "kustomization.yaml" and all("kind" in d for d in _docs(p))
    )
    assert sorted(listed) == objects
    assert len(set(listed)) == len(listed)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed (optional)")
def test_kubectl_kustomize_renders_the_same_objects():
    out = subprocess.run(["kubectl", "kustomize", str(paths.K8S)], capture_output=True, text=True, check=True)
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    files = [d for f, d in _resources() if f.parent == paths.K8S]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in rendered) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in files
    )
    namespace = _kustomization(paths.K8S)["namespace"]
    assert {d["metadata"].get("namespace") for d in rendered if d["kind"] != "Namespace"} == {namespace}


def test_the_pods_run_the_supervisor_with_its_real_options():
    args = _container_args()  # argparse exits on an option the supervisor does not have
    container = _container()
    assert "--shared-redis" not in container["args"] and args.redis_url, "Redis is its own Deployment"
    host, port = re.fullmatch(r"redis://([^:/]+):(\d+)/\d+", args.redis_url).groups()
    redis_service = _objects("Service")[host]
    assert int(port) in [p["port"] for p in redis_service["spec"]["ports"]]
    assert _ports(container) == {
        "grpc": args.grpc_port,
        "http": args.http_port,
        "metrics": args.metrics_port,
        "probe": args.probe_port,
    }
    assert args.probe_address == "0.0.0.0", "the kubelet probes the pod's address"


def test_the_probes_ask_the_supervisors_endpoints():
    container, args = _container(), _container_args()
    want = {"startupProbe": READINESS_PATH, "readinessProbe": READINESS_PATH, "livenessProbe": LIVENESS_PATH}
    for probe, path in want.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert _ports(container)[get["port"]] == args.probe_port, probe
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 180, "the first load may take minutes"


def _gateway_args():
    from switchboard.gateway.__main__ import parser as gateway_parser

    return gateway_parser().parse_args(_container("switchboard-gateway")["args"])


def test_the_gateway_runs_with_its_real_options_in_front_of_the_balancer():
    container, args = _container("switchboard-gateway"), _gateway_args()  # argparse exits on a wrong option
    assert container["command"] == ["/app/.venv/bin/python", "-m", "switchboard.gateway"]
    assert "/app/.venv" in (paths.ROOT / "deploy" / "Dockerfile").read_text(), "the image's venv"
    host, port = args.grpc_url.rsplit(":", 1)
    balancer = _objects("Service")[host]
    assert balancer["spec"]["selector"] == {"app.kubernetes.io/name": "switchboard-balancer"}, "through HAProxy"
    assert int(port) in [p["port"] for p in balancer["spec"]["ports"]]
    assert _ports(container) == {"http": args.port} and args.host == "0.0.0.0"
    env = {e["name"]: e for e in container["env"]}
    from switchboard.gateway.keys import ENV

    assert env[ENV]["valueFrom"]["secretKeyRef"]["optional"] is True, "API keys from the Secret, if set"


def test_the_gateways_probes_ask_its_endpoints():
    from switchboard.gateway.app import ROUTES

    container, served = _container("switchboard-gateway"), {path for path, _, methods in ROUTES if "GET" in methods}
    for probe, path in {"readinessProbe": "/readyz", "livenessProbe": "/healthz"}.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path and path in served, probe
        assert _ports(container)[get["port"]] == _gateway_args().port, probe


def _redis_argv(tmp_path, monkeypatch) -> list[str]:
    """The command line Stack.start_redis (make serve's Redis) runs, without running it."""
    seen = []
    monkeypatch.setattr(launch, "port_open", lambda port: False)
    monkeypatch.setattr(launch, "wait_until", lambda *a, **k: None)
    monkeypatch.setattr(launch.subprocess, "Popen", lambda argv, **kw: seen.append(argv))
    launch.Stack(launch.Ports(redis=6379), run_dir=tmp_path).start_redis()
    return seen[0][1:]


def _options(argv) -> dict:
    return {argv[i]: argv[i + 1] for i in range(0, len(argv), 2)}


def test_redis_is_configured_as_make_serve_starts_it(tmp_path, monkeypatch):
    local = _options(_redis_argv(tmp_path, monkeypatch))
    cluster = _options(_container("redis")["args"])
    assert local["--maxmemory-policy"] == "volatile-ttl", "what docs/kv-cache.md relies on"
    for option in ("--save", "--appendonly", "--maxmemory", "--maxmemory-policy", "--daemonize", "--port"):
        assert cluster[option] == local[option], option
    assert cluster["--bind"] == "0.0.0.0" and cluster["--protected-mode"] == "no", "reached from other pods"


def test_labels_and_selectors_match():
    deployments = _objects("Deployment")
    for name, d in deployments.items():
        assert _matches(d["spec"]["selector"]["matchLabels"], d["spec"]["template"]["metadata"]["labels"]), name
    for name, svc in _objects("Service").items():
        chosen = [
            d
            for d in deployments.values()
            if _matches(svc["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
        ]
        assert len(chosen) == 1, f"Service {name} selects {len(chosen)} Deployments"
        ports = {p["name"] for c in chosen[0]["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports, f"Service {name}: no container port {p['targetPort']}"
    server = deployments["switchboard"]["spec"]["template"]["metadata"]["labels"]
    assert _matches(_objects("PodDisruptionBudget")["switchboard"]["spec"]["selector"]["matchLabels"], server)
    policy = _objects("NetworkPolicy")["redis"]["spec"]
    assert _matches(
        policy["podSelector"]["matchLabels"], deployments["redis"]["spec"]["template"]["metadata"]["labels"]
    )
    assert _matches(policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"], server)
    assert not _matches(
        policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"],
        deployments["switchboard-balancer"]["spec"]["template"]["metadata"]["labels"],
    ), "only the servers reach Redis"
    assert not _matches(
        policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"],
        deployments["switchboard-gateway"]["spec"]["template"]["metadata"]["labels"],
    ), "the gateway reaches the servers over gRPC, never Redis"
    gateway = deployments["switchboard-gateway"]["spec"]["template"]["metadata"]["labels"]
    assert _matches(_objects("PodDisruptionBudget")["switchboard-gateway"]["spec"]["selector"]["matchLabels"], gateway)
    assert not _matches(_objects("PodDisruptionBudget")["switchboard"]["spec"]["selector"]["matchLabels"], gateway)
    target = _objects("HorizontalPodAutoscaler")["switchboard"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "switchboard")


def _adapter_rules() -> list[dict]:
    config = _docs(ADAPTER)[0]["data"]["config.yaml"]
    return yaml.safe_load(config)["rules"]


def _exported_names(monkeypatch) -> set[str]:
    """The metric families chat registers on Triton's metrics port: the histograms and counters
    of switchboard.serving.metrics, and the gauges the glue adds (through a recording stand-in
    for triton_python_backend_utils)."""
    from tests.unit.pb_stub import stub_glue

    names = set()

    class Family:
        HISTOGRAM, COUNTER, GAUGE = "histogram", "counter", "gauge"

        def __init__(self, name, description, kind):
            names.add(name)

        def Metric(self, labels, **kwargs):  # noqa: N802 (pb_utils' name)
            return types.SimpleNamespace(increment=lambda v: None, observe=lambda v: None, set=lambda v: None)

    glue = stub_glue(monkeypatch, "switchboard.triton.chat_metrics")
    monkeypatch.setattr(sys.modules["triton_python_backend_utils"], "MetricFamily", Family, raising=False)
    glue.ChatMetricsPublisher(None, None, None, ("engine_short", "engine_long"), interval=3600)
    asr_glue = stub_glue(monkeypatch, "switchboard.triton.asr_metrics")
    monkeypatch.setattr(sys.modules["triton_python_backend_utils"], "MetricFamily", Family, raising=False)
    asr_glue.AsrMetricsPublisher(AsrMetrics(), types.SimpleNamespace(pending_s=0.0), interval=3600).close()
    series = set(names)
    for prefix, metrics in ((PREFIX, METRICS), (ASR_PREFIX, ASR_METRICS)):
        for name, (kind, *_rest) in metrics.items():
            assert prefix + name in names
            if kind == "histogram":
                series |= {prefix + name + suffix for suffix in ("_bucket", "_sum", "_count")}
    return series


def test_the_adapters_series_are_metrics_the_server_exports(monkeypatch):
    exported = _exported_names(monkeypatch)
    assert PREFIX + "admission_waiting" in exported and ASR_PREFIX + "queue_seconds_bucket" in exported
    for rule in _adapter_rules():
        series = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["seriesQuery"]).group(0)
        assert series in exported, series
        assert re.fullmatch(rule["name"]["matches"].strip("^$"), series), rule["name"]
        assert {"namespace", "pod"} == set(rule["resources"]["overrides"]), "per pod, for a Pods metric"


def _adapter_external_rules() -> list[dict]:
    config = _docs(ADAPTER)[0]["data"]["config.yaml"]
    return yaml.safe_load(config)["externalRules"]


def test_the_hpa_scales_on_metrics_the_adapter_exposes():
    spec = _objects("HorizontalPodAutoscaler")["switchboard"]["spec"]
    assert {m["type"] for m in spec["metrics"]} == {"Pods", "External"}
    for kind, rules in (("Pods", _adapter_rules()), ("External", _adapter_external_rules())):
        exposed = {rule["name"]["as"] for rule in rules}
        names = [m[kind.lower()]["metric"]["name"] for m in spec["metrics"] if m["type"] == kind]
        assert names and set(names) <= exposed, set(names) - exposed
    assert spec["minReplicas"] >= 2 and spec["maxReplicas"] > spec["minReplicas"]
    up, down = spec["behavior"]["scaleUp"], spec["behavior"]["scaleDown"]
    assert up["stabilizationWindowSeconds"] == 0 and down["stabilizationWindowSeconds"] >= 180


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (make setup installs it)")
def test_the_adapters_queries_are_valid_promql(tmp_path):
    rules = []
    for i, rule in enumerate(_adapter_rules() + _adapter_external_rules()):
        series = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["seriesQuery"]).group(0)
        expr = (
            rule["metricsQuery"]
            .replace("<<.Series>>", series)
            .replace("<<.LabelMatchers>>", 'namespace="switchboard",pod=~"switchboard-.*"')
            .replace("<<.GroupBy>>", "namespace, pod")
        )
        rules.append({"record": f"adapter:rule_{i}", "expr": expr})
    path = tmp_path / "adapter-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "adapter", "rules": rules}]}))
    check = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_prometheus_scrapes_the_pods_metrics_port():
    pod = _objects("Deployment")["switchboard"]["spec"]["template"]
    annotations, args = pod["metadata"]["annotations"], _container_args()
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == args.metrics_port
    job = yaml.safe_load(SCRAPE.read_text())["scrape_configs"][0]
    keep = {tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"}
    assert keep[("__meta_kubernetes_pod_annotation_prometheus_io_scrape",)] == "true"
    assert _ports(_container())[keep[("__meta_kubernetes_pod_container_port_name",)]] == args.metrics_port
    targets = {r.get("target_label") for r in job["relabel_configs"]}
    assert {"namespace", "pod"} <= targets, "the labels the adapter maps to Kubernetes objects"


def _balancer_config() -> str:
    return _objects("ConfigMap")["switchboard-balancer"]["data"]["haproxy.cfg"]


@pytest.mark.skipif(shutil.which("haproxy") is None and not shutil.which("/usr/sbin/haproxy"), reason="no haproxy")
def test_haproxy_accepts_the_balancer_config(tmp_path):
    path = tmp_path / "haproxy.cfg"
    path.write_text(_balancer_config())
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    check = subprocess.run([binary, "-c", "-f", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_balancer_keeps_sessions_as_make_serve_does_and_checks_readiness():
    config, args = _balancer_config(), _container_args()
    local = haproxy_config(8001, [Replica("r", 9001, 9000)])
    for line in (f"balance hdr({SESSION_HEADER})", "hash-type consistent", "option redispatch 1", "timeout tunnel 1h"):
        assert line in local and line in config, line
    assert f"option httpchk GET {READINESS_PATH}" in config
    service = _objects("Service")["switchboard-replicas"]
    assert service["spec"]["clusterIP"] == "None", "one DNS record per ready pod"
    namespace = _kustomization(paths.K8S)["namespace"]
    template = re.search(r"^\s*server-template \S+ \d+ (\S+):(\d+) (.*)$", config, re.M)
    assert template.group(1) == f"switchboard-replicas.{namespace}.svc.cluster.local"
    assert int(template.group(2)) == args.grpc_port
    assert f"check port {args.probe_port} check-proto h1" in template.group(3) and "proto h2" in template.group(3)
    container = _container("switchboard-balancer")
    assert re.search(r"^\s*bind :(\d+) proto h2$", config, re.M).group(1) == str(_ports(container)["grpc"])


def test_the_image_is_built_by_make_targets_that_exist():
    """The Dockerfile builds what `make serve` serves, the recognizer included, through the
    Makefile: a renamed target would fail only in a docker build, never run here."""
    dockerfile = (paths.ROOT / "deploy" / "Dockerfile").read_text()
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", (paths.ROOT / "Makefile").read_text(), re.M))
    used = set(re.findall(r"(?:RUN|&&|\)|;)\s+make ([a-z][a-z0-9-]*)", dockerfile))
    assert {"setup", "export", "export-asr", "model-asr-tiny-en"} <= used, used
    assert used <= targets, used - targets
    assert re.search(r"^ARG ASR=default$", dockerfile, re.M), "the embedded recognizer unless asked"


# The capacity planner (capacity.yaml; docs/capacity.md)


def _capacity_args():
    from switchboard.ops.capacity.__main__ import parser as capacity_parser

    container = _container("switchboard-capacity")
    assert container["command"] == ["/app/.venv/bin/python", "-m", "switchboard.ops.capacity"]
    return capacity_parser().parse_args(container["args"])  # argparse exits on a wrong option


def test_the_capacity_planner_runs_with_its_real_options_and_the_hpas_limits():
    args, hpa = _capacity_args(), _objects("HorizontalPodAutoscaler")["switchboard"]["spec"]
    assert args.command == "serve" and args.prometheus
    assert (args.floor, args.ceiling) == (hpa["minReplicas"], hpa["maxReplicas"])
    container = _container("switchboard-capacity")
    assert _ports(container) == {"metrics": args.port}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, probe


def test_the_planners_calendar_is_the_mounted_configmap_and_the_example():
    from switchboard.ops.capacity import calendar

    args = _capacity_args()
    pod = _objects("Deployment")["switchboard-capacity"]["spec"]["template"]["spec"]
    [mount] = pod["containers"][0]["volumeMounts"]
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    config_map = _objects("ConfigMap")[volume["configMap"]["name"]]
    assert args.calendar.parent.as_posix() == mount["mountPath"]
    text = config_map["data"][args.calendar.name]
    assert calendar.parse(text, "capacity.yaml").promotions
    assert text == (paths.ROOT / "deploy" / "capacity" / "double-11.toml").read_text()


def test_the_hpas_external_metric_is_the_planners_gauge_read_as_a_count():
    from switchboard.ops.capacity.calendar import Calendar
    from switchboard.ops.capacity.exporter import DESIRED, exposition
    from switchboard.ops.capacity.plan import Plan
    from switchboard.ops.promql import exported_names

    [external] = [
        m["external"]
        for m in _objects("HorizontalPodAutoscaler")["switchboard"]["spec"]["metrics"]
        if m["type"] == "External"
    ]
    assert external["metric"]["name"] == DESIRED
    assert external["target"] == {"type": "AverageValue", "averageValue": "1"}, "desired = the gauge's value"
    [rule] = _adapter_external_rules()
    series = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["seriesQuery"]).group(0)
    assert series in exported_names(exposition(Plan(3, {"floor": 3}), Calendar(), True))
    assert set(rule["resources"]["overrides"]) == {"namespace"}, "the HPA's namespace, not a pod"


def test_prometheus_scrapes_the_planner_in_a_job_of_its_own():
    args = _capacity_args()
    jobs = {j["job_name"]: j for j in yaml.safe_load(SCRAPE.read_text())["scrape_configs"]}
    job = jobs["switchboard-capacity"]
    keep = {tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"}
    labels = _objects("Deployment")["switchboard-capacity"]["spec"]["template"]["metadata"]["labels"]
    assert keep[("__meta_kubernetes_pod_label_app_kubernetes_io_name",)] == labels["app.kubernetes.io/name"]
    assert _ports(_container("switchboard-capacity"))[keep[("__meta_kubernetes_pod_container_port_name",)]] == args.port
    assert "prometheus.io/scrape" not in _objects("Deployment")["switchboard-capacity"]["spec"]["template"][
        "metadata"
    ].get("annotations", {}), "not in the servers' job"
    assert {"namespace", "pod"} <= {r.get("target_label") for r in job["relabel_configs"]}


def test_the_planners_forecast_reads_series_the_server_exports(monkeypatch):
    from switchboard.ops.capacity.exporter import DEMAND_QUERY
    from switchboard.ops.promql import metric_names

    exported = _exported_names(monkeypatch)
    assert metric_names(DEMAND_QUERY) == ["switchboard_chat_requests_total"]
    assert PREFIX + "requests_total" in exported, "every chat that arrived, FAQ answers included"
