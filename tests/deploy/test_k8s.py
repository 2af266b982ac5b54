"""deploy/k8s/: the base's manifests and both overlays as kustomize renders them (kubectl's built-in
kustomize), validated offline against the Kubernetes JSON schemas (kubernetes-validate, strict: unknown
fields fail), then checked against each other and against the server: probes on the right endpoints, a
grace period that covers the drain, an HPA metric that the adapter serves and Quill exports."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, REPO, quill_env_vars, quill_sample_names, require_tool

K8S = DEPLOY / "k8s"
OVERLAYS = ("cpu", "gpu")
# The oldest release whose APIs these manifests need (autoscaling/v2, policy/v1: 1.23+) that is still
# maintained somewhere, and the newest schemas the validator ships.
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")
# ServiceMonitor is a custom resource (Prometheus Operator): no schema in kubernetes-validate, so the
# fields used here are checked against this subset of its CRD.
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {"type": "object", "properties": {"matchLabels": {"type": "object"}}},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                   "interval": {"type": "string", "pattern": r"^[0-9]+(ms|s|m|h)$"},
                                   "scrapeTimeout": {"type": "string"}, "scheme": {"enum": ["http", "https"]}},
                }},
            },
        },
    },
}


def validate(doc: dict) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip package kubernetes-validate "
                                              "(the `test` extra) validates manifests offline")
    if doc["kind"] == "ServiceMonitor":
        import jsonschema

        jsonschema.validate(doc, SERVICE_MONITOR_SCHEMA)
        return
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


def render(overlay: str) -> list[dict]:
    kubectl = require_tool("kubectl")
    result = subprocess.run([kubectl, "kustomize", str(K8S / "overlays" / overlay)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request) -> tuple[str, dict[str, dict]]:
    docs = render(request.param)
    by_kind = {d["kind"]: d for d in docs}
    assert len(by_kind) == len(docs), "one object of each kind"
    return request.param, by_kind


def base_resources() -> list[Path]:
    kustomization = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    return [K8S / "base" / name for name in kustomization["resources"]]


# ---- schemas ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", base_resources(), ids=lambda p: p.name)
def test_base_manifests_are_valid_on_their_own(path):
    """Each base file is a whole object: valid without kustomize."""
    for doc in yaml.safe_load_all(path.read_text()):
        validate(doc)


def test_validator_is_strict():
    doc = yaml.safe_load((K8S / "base" / "deployment.yaml").read_text())
    doc["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}  # a typo
    with pytest.raises(Exception, match="readinesProbe"):
        validate(doc)


def test_rendered_overlays_are_valid(rendered):
    _, by_kind = rendered
    assert set(by_kind) == {"ConfigMap", "Service", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                            "ServiceMonitor", "PersistentVolumeClaim"}
    for doc in by_kind.values():
        validate(doc)


# ---- the pieces fit together, and fit the server ------------------------------------------------

def pod_spec(by_kind) -> dict:
    return by_kind["Deployment"]["spec"]["template"]["spec"]


def container(by_kind) -> dict:
    (c,) = pod_spec(by_kind)["containers"]
    return c


def test_config_map_holds_real_flags(rendered):
    overlay, by_kind = rendered
    config = by_kind["ConfigMap"]["data"]
    assert set(config) <= quill_env_vars(), set(config) - quill_env_vars()
    assert container(by_kind)["envFrom"] == [{"configMapRef": {"name": by_kind["ConfigMap"]["metadata"]["name"]}}]
    assert config["QUILL_DEVICE"] == {"cpu": "cpu", "gpu": "cuda"}[overlay]
    assert config["QUILL_HOST"] == "0.0.0.0"


def test_probes(rendered):
    _, by_kind = rendered
    c = container(by_kind)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["http"] == int(by_kind["ConfigMap"]["data"]["QUILL_PORT"])
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    startup = c["startupProbe"]
    assert startup["httpGet"]["path"] == "/ready"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, "minutes for loading checkpoints"


def test_grace_period_covers_the_drain(rendered):
    _, by_kind = rendered
    drain = float(by_kind["ConfigMap"]["data"]["QUILL_DRAIN_SECONDS"])
    assert pod_spec(by_kind)["terminationGracePeriodSeconds"] >= drain + 10
    assert "lifecycle" not in container(by_kind), "the server drains on SIGTERM by itself"


def test_runs_as_the_image_user(rendered):
    _, by_kind = rendered
    security = pod_spec(by_kind)["securityContext"]
    user = re.search(r"^USER (\d+)", (REPO / "Dockerfile").read_text(), re.M).group(1)
    assert security["runAsNonRoot"] and security["runAsUser"] == int(user)
    mounts = {m["mountPath"]: m for m in container(by_kind)["volumeMounts"]}
    assert mounts["/models"]["readOnly"]
    (models,) = [v for v in pod_spec(by_kind)["volumes"] if v["name"] == mounts["/models"]["name"]]
    assert models["persistentVolumeClaim"]["claimName"] == by_kind["PersistentVolumeClaim"]["metadata"]["name"]


def test_selectors_match_the_pods(rendered):
    _, by_kind = rendered
    pod_labels = by_kind["Deployment"]["spec"]["template"]["metadata"]["labels"]
    service = by_kind["Service"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert by_kind["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    monitor = by_kind["ServiceMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    assert all(e["path"] == "/metrics" for e in monitor["endpoints"])


def test_hpa_scales_on_the_adapter_metric(rendered):
    _, by_kind = rendered
    hpa = by_kind["HorizontalPodAutoscaler"]["spec"]
    deployment = by_kind["Deployment"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": deployment["metadata"]["name"]}
    (metric,) = hpa["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["target"]["type"] == "AverageValue"
    name = metric["pods"]["metric"]["name"]

    adapter = yaml.safe_load((K8S / "prometheus-adapter" / "values.yaml").read_text())
    (rule,) = [r for r in adapter["rules"]["custom"] if r["name"]["as"] == name]
    series = re.match(r"(\w+)\{", rule["seriesQuery"]).group(1)
    assert series in quill_sample_names() and re.fullmatch(rule["name"]["matches"], series)
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    assert "<<.Series>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]

    budget = by_kind["PodDisruptionBudget"]["spec"]
    assert hpa["minReplicas"] > budget.get("maxUnavailable", 0), "a disruption never takes every pod"


def test_overlay_specifics(rendered):
    overlay, by_kind = rendered
    c = container(by_kind)
    assert c["image"] == {"cpu": "quill:cpu", "gpu": "quill:cuda"}[overlay]
    limits = c["resources"]["limits"]
    if overlay == "gpu":
        assert limits["nvidia.com/gpu"] == 1, "one model replica per GPU"
        spec = pod_spec(by_kind)
        assert spec["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
        assert by_kind["HorizontalPodAutoscaler"]["spec"]["maxReplicas"] >= 2
    else:
        assert "nvidia.com/gpu" not in limits and "nodeSelector" not in pod_spec(by_kind)
