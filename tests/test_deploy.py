"""deploy/k8s: every overlay builds, validates against the Kubernetes schemas (offline, with
kubernetes-validate), and agrees with the service: probes on its endpoints, the stop sequence's
budget, the image's user, and the metric the autoscalers scale on, read from the app's /metrics.

Overlays are built by ``build`` below, which does the part of kustomize these manifests use
(resources, components, patches, namespace) and refuses anything else; where kubectl is
installed, ``kubectl kustomize`` must build the same objects. KEDA's ScaledObject and the
Prometheus operator's PodMonitor are custom resources with no schema in kubernetes-validate: their
fields are checked against the documented ones, and the HorizontalPodAutoscaler KEDA would create
from the ScaledObject against the Kubernetes schema.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from service.main import SHUTDOWN_BACKSTOP_S
from service.settings import Settings
from tests.test_api import fake_app, serving

K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
OVERLAYS = sorted(path.parent for path in K8S.glob("overlays/*/kustomization.yaml"))
COMPONENTS = {path.parent.name: path.parent for path in K8S.glob("components/*/kustomization.yaml")}
# The oldest Kubernetes still commonly run by managed clouds, and the newest with schemas here.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")

Resource = dict[str, Any]


# -- a kustomize for these manifests -------------------------------------------------------------


def build(directory: Path, resources: list[Resource] | None = None) -> list[Resource]:
    """The objects ``kubectl kustomize directory`` makes, for the features used here."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(spec) - {"apiVersion", "kind", "namespace", "resources", "components",
                               "patches"}
    assert not unsupported, f"{directory}: build() does not do {unsupported}"
    own: list[Resource] = []
    for entry in spec.get("resources", []):
        path = directory / entry
        own += build(path) if path.is_dir() else list(yaml.safe_load_all(path.read_text()))
    objects = [*(resources or []), *own]
    for entry in spec.get("components", []):
        objects = build(directory / entry, objects)
    for patch in spec.get("patches", []):
        assert set(patch) == {"path"}, patch
        change = yaml.safe_load((directory / patch["path"]).read_text())
        targets = [i for i, o in enumerate(objects) if identity(o) == identity(change)]
        assert len(targets) == 1, f"{patch['path']} patches {len(targets)} objects"
        objects[targets[0]] = merge(objects[targets[0]], change)
    if "namespace" in spec:
        for resource in objects if spec["kind"] == "Kustomization" else own:
            if resource["kind"] != "Namespace":
                resource.setdefault("metadata", {})["namespace"] = spec["namespace"]
    return objects


def merge(base: Any, patch: Any) -> Any:
    """A strategic merge patch, as far as these patches need: maps merge, lists of named
    items (containers, env, volumes) merge by name, other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        return {**base, **{key: merge(base.get(key), value) for key, value in patch.items()}}
    named = isinstance(base, list) and isinstance(patch, list) and all(
        isinstance(item, dict) and "name" in item for item in [*base, *patch])
    if named:
        by_name = {item["name"]: item for item in base}
        added = [item for item in patch if item["name"] not in by_name]
        changed = {item["name"]: merge(by_name[item["name"]], item)
                   for item in patch if item["name"] in by_name}
        return [*added, *(changed.get(item["name"], item) for item in base)]
    return patch


def identity(resource: Resource) -> tuple[str, str]:
    return resource["kind"], resource["metadata"]["name"]


def of_kind(objects: list[Resource], kind: str) -> Resource:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def container(deployment: Resource) -> Resource:
    (found,) = deployment["spec"]["template"]["spec"]["containers"]
    return found


def environment(deployment: Resource) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container(deployment)["env"]}


@pytest.fixture(params=OVERLAYS, ids=lambda path: path.name)
def overlay(request: pytest.FixtureRequest) -> list[Resource]:
    return build(request.param)


# -- the manifests --------------------------------------------------------------------------------


def test_there_are_cpu_and_gpu_overlays_and_the_optional_components() -> None:
    assert [path.name for path in OVERLAYS] == ["cpu", "gpu"]
    assert set(COMPONENTS) == {"hpa-prometheus-adapter", "keda", "models", "podmonitor",
                               "redis"}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schema(
    overlay: list[Resource], version: str
) -> None:
    kinds = sorted(o["kind"] for o in overlay)
    assert kinds == ["Deployment", "HorizontalPodAutoscaler", "Namespace",
                     "PodDisruptionBudget", "Service"]
    for resource in overlay:
        kubernetes_validate.validate(resource, version, strict=True)
        if resource["kind"] != "Namespace":
            assert resource["metadata"]["namespace"] == "translator", identity(resource)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("directory", OVERLAYS, ids=lambda path: path.name)
def test_kubectl_kustomize_builds_the_same_objects(directory: Path) -> None:
    built = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True,
                           text=True, check=True, timeout=60).stdout
    by_identity = {identity(o): o for o in yaml.safe_load_all(built)}
    assert by_identity == {identity(o): o for o in build(directory)}


def test_probes_and_security_match_the_service_and_the_image(overlay: list[Resource]) -> None:
    deployment = of_kind(overlay, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    main = container(deployment)
    assert main["startupProbe"]["httpGet"]["path"] == "/ready"  # loaded and warmed up
    assert main["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert main["livenessProbe"]["httpGet"]["path"] == "/health"  # fails only when a restart helps
    ports = {port["name"]: port["containerPort"] for port in main["ports"]}
    env = environment(deployment)
    assert ports == {"http": int(env["PORT"]), "probes": int(env["PROBE_PORT"])}
    Settings(port=env["PORT"], probe_port=env["PROBE_PORT"])  # valid: two ports apart
    scraped = deployment["spec"]["template"]["metadata"]["annotations"]
    assert (scraped["prometheus.io/port"], scraped["prometheus.io/path"]) == (
        str(ports["probes"]), "/metrics")
    assert "replicas" not in deployment["spec"]  # the autoscaler's to set
    # The probes on PROBE_PORT's listener, which a flood of connections on PORT cannot fill.
    assert {main[probe]["httpGet"]["port"] for probe in
            ("startupProbe", "readinessProbe", "livenessProbe")} == {"probes"}
    service = of_kind(overlay, "Service")["spec"]
    assert [port["targetPort"] for port in service["ports"]] == ["http"]  # probes stay inside
    startup = main["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # a model load

    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # USER in Dockerfile and Dockerfile.cuda
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    assert main["securityContext"]["capabilities"]["drop"] == ["ALL"]
    tmp = next(v for v in pod["volumes"] if "emptyDir" in v)
    assert {"name": tmp["name"], "mountPath": "/tmp"} in main["volumeMounts"]

    resources = main["resources"]
    assert resources["requests"] == resources["limits"]  # the Guaranteed class
    assert {"cpu", "memory"} <= set(resources["limits"])


def test_the_kubelet_waits_for_the_whole_stop_sequence(overlay: list[Resource]) -> None:
    deployment = of_kind(overlay, "Deployment")
    env = environment(deployment)
    settings = Settings(shutdown_delay_s=env["SHUTDOWN_DELAY_S"],
                        shutdown_grace_s=env["SHUTDOWN_GRACE_S"])
    stop_sequence = settings.shutdown_delay_s + settings.shutdown_grace_s + SHUTDOWN_BACKSTOP_S
    grace_period = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert stop_sequence + 5 <= grace_period <= stop_sequence + 30
    # A preStop hook would run before SIGTERM and so add to the sequence unaccounted.
    assert "lifecycle" not in container(deployment)
    assert settings.shutdown_delay_s >= 3  # long enough for endpoints to be updated


def test_the_budget_and_the_service_select_the_deployments_pods(overlay: list[Resource]) -> None:
    deployment = of_kind(overlay, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for kind in ("Service", "PodDisruptionBudget"):
        spec = of_kind(overlay, kind)["spec"]
        selector = spec["selector"].get("matchLabels", spec["selector"])
        assert selector.items() <= labels.items(), kind
    autoscaler = of_kind(overlay, "HorizontalPodAutoscaler")["spec"]
    assert autoscaler["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    pdb = of_kind(overlay, "PodDisruptionBudget")["spec"]
    assert pdb["maxUnavailable"] < autoscaler["minReplicas"]  # a drain never empties the service


def test_the_pod_monitor_scrapes_the_deployments_pods(overlay: list[Resource]) -> None:
    deployment = of_kind(overlay, "Deployment")
    (monitor,) = build(COMPONENTS["podmonitor"], [])
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    spec = monitor["spec"]
    # The fields of the Prometheus operator's PodMonitor used here.
    assert set(spec) == {"selector", "podMetricsEndpoints"}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = spec["podMetricsEndpoints"]
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout"}
    assert endpoint["port"] == "probes"  # PROBE_PORT, as the pods' annotations say
    assert endpoint["port"] in {port["name"] for port in container(deployment)["ports"]}
    assert endpoint["path"] == "/metrics"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_redis_component_shares_state_between_the_pods(overlay: list[Resource],
                                                           version: str) -> None:
    objects = build(COMPONENTS["redis"], overlay)
    assert sorted(o["kind"] for o in objects if o not in overlay) == [
        "Deployment", "Service", "StatefulSet"]  # the Deployment: with STATE_URL
    for resource in objects:
        kubernetes_validate.validate(resource, version, strict=True)
    redis = of_kind(objects, "StatefulSet")
    (service,) = [o for o in objects if identity(o) == ("Service", "redis")]
    (port,) = service["spec"]["ports"]
    assert service["spec"]["selector"].items() <= redis["spec"]["template"]["metadata"][
        "labels"].items()
    url = environment(of_kind(objects, "Deployment"))["STATE_URL"]
    assert url == f"redis://{service['metadata']['name']}:{port['port']}/0"
    assert Settings(state_url=url).state_url == url
    args = container(redis)["args"]
    assert args[args.index("--appendonly") + 1] == "yes"  # what clients were told survives
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_models_component_installs_into_a_volume_the_pods_share(overlay: list[Resource],
                                                                    version: str) -> None:
    objects = build(COMPONENTS["models"], overlay)
    for resource in objects:
        kubernetes_validate.validate(resource, version, strict=True)
    claim = of_kind(objects, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    pod = of_kind(objects, "Deployment")["spec"]["template"]["spec"]
    (install,) = pod["initContainers"]
    served = environment(of_kind(objects, "Deployment"))
    init_env = {e["name"]: e["value"] for e in install["env"]}
    assert init_env["MODELS"] == served["MODELS"] and served["MODEL_DIR"] == "/models"
    assert "translate-models --model-dir /models install" in install["command"][-1]
    volume = next(v for v in pod["volumes"] if v["name"] == "models")
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    mounts = {m["name"]: m for m in container(of_kind(objects, "Deployment"))["volumeMounts"]}
    assert mounts["models"]["mountPath"] == "/models" and mounts["models"]["readOnly"]
    assert Settings(model_dir=served["MODEL_DIR"], models=served["MODELS"]).models == ["en-de"]


def test_the_gpu_overlay_asks_for_a_gpu_and_the_cuda_image() -> None:
    deployment = of_kind(build(K8S / "overlays" / "gpu"), "Deployment")
    assert container(deployment)["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container(deployment)["image"].endswith("-cuda")  # docker-compose.yml's tag
    assert environment(deployment)["DEVICE"] == "cuda"
    cpu = of_kind(build(K8S / "overlays" / "cpu"), "Deployment")
    assert environment(cpu)["DEVICE"] == "cpu"
    assert "nvidia.com/gpu" not in container(cpu)["resources"]["limits"]


# -- the metric the autoscalers scale on ---------------------------------------------------------


def served_metrics(tmp_path: Path) -> dict[str, Any]:
    """The metric families the app's /metrics serves, by name."""

    async def main() -> str:
        async with serving(fake_app(tmp_path)) as client:
            response = await client.get("/metrics")
            assert response.status_code == 200
            return response.text

    return {family.name: family for family in text_string_to_metric_families(asyncio.run(main()))}


def scaling_metric(overlay: list[Resource]) -> str:
    (metric,) = of_kind(overlay, "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["target"]["type"] == "AverageValue"
    return metric["pods"]["metric"]["name"]


def adapter_rule() -> dict[str, Any]:
    path = COMPONENTS["hpa-prometheus-adapter"] / "prometheus-adapter-rules.yaml"
    (rule,) = yaml.safe_load(path.read_text())["rules"]["custom"]
    return rule


def test_the_hpa_metric_is_served_by_metrics_through_the_adapter_rule(
    overlay: list[Resource], tmp_path: Path
) -> None:
    name = scaling_metric(overlay)
    rule = adapter_rule()
    assert rule["name"]["as"] == name
    series = rule["seriesQuery"].split("{")[0]
    assert f"{series}{{" in rule["seriesQuery"]
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}  # a value per pod
    family = served_metrics(tmp_path)[series]
    assert family.type == "gauge"
    (sample,) = family.samples  # one unlabelled series per pod: no sum over labels needed
    assert sample.labels == {} and sample.value == 0


def test_the_keda_scaled_object_scales_the_same_way(tmp_path: Path) -> None:
    objects = build(K8S / "overlays" / "cpu")
    deployment = of_kind(objects, "Deployment")
    hpa = of_kind(objects, "HorizontalPodAutoscaler")["spec"]
    (scaled,) = build(COMPONENTS["keda"], [])
    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    spec = scaled["spec"]
    # The fields of KEDA 2's ScaledObject (keda.sh/v1alpha1) and of a prometheus trigger.
    assert set(spec) <= {"scaleTargetRef", "pollingInterval", "cooldownPeriod",
                         "initialCooldownPeriod", "idleReplicaCount", "minReplicaCount",
                         "maxReplicaCount", "fallback", "advanced", "triggers"}
    assert spec["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    (trigger,) = spec["triggers"]
    assert set(trigger) <= {"type", "name", "metadata", "metricType", "authenticationRef",
                            "useCachedMetrics"}
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert {"serverAddress", "query", "threshold"} <= set(trigger["metadata"])
    assert all(isinstance(value, str) for value in trigger["metadata"].values())
    # The same metric, replica range and per-pod target as the HorizontalPodAutoscaler.
    assert f"{scaling_metric(objects)}{{" in trigger["metadata"]["query"]
    assert scaling_metric(objects) in served_metrics(tmp_path)
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (hpa["minReplicas"],
                                                                  hpa["maxReplicas"])
    assert trigger["metadata"]["threshold"] == hpa["metrics"][0]["pods"]["target"]["averageValue"]
    # KEDA makes a HorizontalPodAutoscaler from it: that one must be valid too.
    made = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": f"keda-hpa-{scaled['metadata']['name']}"},
        "spec": {
            "scaleTargetRef": spec["scaleTargetRef"],
            "minReplicas": spec["minReplicaCount"],
            "maxReplicas": spec["maxReplicaCount"],
            "behavior": spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"],
            "metrics": [{"type": "External", "external": {
                "metric": {"name": "s0-prometheus"},
                "target": {"type": "AverageValue",
                           "averageValue": trigger["metadata"]["threshold"]},
            }}],
        },
    }
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(made, version, strict=True)
    assert made["spec"]["behavior"] == hpa["behavior"]
