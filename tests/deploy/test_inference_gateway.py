"""deploy/k8s/overlays/inference-gateway/: the overlay as kustomize renders it (kubectl's built-in kustomize), its
Kubernetes objects validated offline against the Kubernetes schemas (kubernetes-validate, strict), its
InferencePool and HTTPRoute against their CRDs' schemas as the projects release them (tests/deploy/schemas/,
strict: unknown fields fail; the CRDs' CEL rules are not evaluated, the one that applies is checked by hand),
then checked against each other and against the server: the pool selects Quill's pods on the port that serves
/metrics, the picker is reachable where the pool says, its configuration names only metrics and labels Quill
exports, and the route sends completions to the pool."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from quill.server.api.cache_config_info import cache_config_labels
from quill.server.engine import CacheConfig
from tests.deploy import test_k8s as k8s
from tests.deploy.conftest import (DEPLOY, PICKER_CONFIG, picker_engine_config, picker_metrics, quill_sample_names,
                                   require_tool)

OVERLAY = DEPLOY / "k8s" / "overlays" / "inference-gateway"
SCHEMAS = Path(__file__).parent / "schemas"
CRD_SCHEMAS = {"InferencePool": "inferencepool-v1.yaml", "HTTPRoute": "httproute-v1.yaml"}
API_VERSIONS = {"InferencePool": "inference.networking.k8s.io/v1", "HTTPRoute": "gateway.networking.k8s.io/v1"}
# The picker's plugin types (its v1.5.0 registry's names) that this configuration may use
KNOWN_PLUGINS = {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "metrics-data-source",
                 "core-metrics-extractor"}
COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")


def strict(schema):
    """A CRD's schema as the API server's strict field validation reads it: an object with listed properties
    takes no others (unless the schema keeps unknown fields)."""
    schema = copy.deepcopy(schema)
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            stack.extend(v for k, v in node.items() if k != "properties")
            stack.extend(node.get("properties", {}).values())
        elif isinstance(node, list):
            stack.extend(node)
    return schema


def validate(doc: dict) -> None:
    if doc["kind"] not in CRD_SCHEMAS:
        k8s.validate(doc)
        return
    import jsonschema

    assert doc["apiVersion"] == API_VERSIONS[doc["kind"]]
    schema = strict(yaml.safe_load((SCHEMAS / CRD_SCHEMAS[doc["kind"]]).read_text()))
    jsonschema.validate(doc, schema)


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    kubectl = require_tool("kubectl")
    result = subprocess.run([kubectl, "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def named(docs, kind: str, name: str) -> dict:
    """The object of that kind and name (a generated ConfigMap's name: with its hash)."""
    pattern = re.compile(rf"{name}(-[a-z0-9]{{10}})?")
    (doc,) = [d for d in docs if d["kind"] == kind and pattern.fullmatch(d["metadata"]["name"])]
    return doc


# ---- schemas ----------------------------------------------------------------------------------

def test_every_object_is_valid(docs):
    kinds = {d["kind"] for d in docs}
    assert {"InferencePool", "HTTPRoute", "ServiceAccount", "Role", "RoleBinding"} <= kinds
    for doc in docs:
        validate(doc)


@pytest.mark.parametrize("kind, path, typo", [
    ("InferencePool", ("spec", "endpointPickerRef"), "failurMode"),
    ("HTTPRoute", ("spec", "rules", 0), "timeout"),
])
def test_crd_validation_is_strict(docs, kind, path, typo):
    import jsonschema

    doc = copy.deepcopy(named(docs, kind, "quill"))
    node = doc
    for key in path:
        node = node[key]
    node[typo] = "x"
    with pytest.raises(jsonschema.ValidationError, match=typo):
        validate(doc)


# ---- the pieces fit together, and fit the server ------------------------------------------------

def quill_pod(docs) -> tuple[dict, dict]:
    """(pod template labels, the quill container) of Quill's Deployment."""
    template = named(docs, "Deployment", "quill")["spec"]["template"]
    (container,) = template["spec"]["containers"]
    return template["metadata"]["labels"], container


def test_pool_selects_quills_pods_on_the_port_that_serves_metrics(docs):
    pool = named(docs, "InferencePool", "quill")["spec"]
    labels, container = quill_pod(docs)
    assert pool["selector"]["matchLabels"].items() <= labels.items()
    epp_labels = named(docs, "Deployment", "quill-epp")["spec"]["template"]["metadata"]["labels"]
    assert not pool["selector"]["matchLabels"].items() <= epp_labels.items(), "the picker is not in its own pool"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    quill_port = int(named(docs, "ConfigMap", "quill-config")["data"]["QUILL_PORT"])
    assert [p["number"] for p in pool["targetPorts"]] == [ports["http"]] == [quill_port]
    assert pool["appProtocol"] == "http"


def test_pool_reaches_the_picker(docs):
    ref = named(docs, "InferencePool", "quill")["spec"]["endpointPickerRef"]
    assert ref.get("kind", "Service") == "Service" and "port" in ref  # the CRD's CEL rule
    service = named(docs, "Service", ref["name"])["spec"]
    (port,) = [p for p in service["ports"] if p["port"] == ref["port"]["number"]]
    epp = named(docs, "Deployment", "quill-epp")["spec"]["template"]
    assert service["selector"].items() <= epp["metadata"]["labels"].items()
    (container,) = epp["spec"]["containers"]
    assert port["targetPort"] in {p["name"] for p in container["ports"]}
    assert ref["failureMode"] == "FailOpen"


def epp_args(docs) -> dict[str, str]:
    (container,) = named(docs, "Deployment", "quill-epp")["spec"]["template"]["spec"]["containers"]
    return dict(re.fullmatch(r"--([a-z-]+)=(.*)", a).groups() for a in container["args"])


def test_picker_watches_the_pool_and_reads_its_config(docs):
    args = epp_args(docs)
    pool = named(docs, "InferencePool", "quill")
    assert args["pool-name"] == pool["metadata"]["name"]
    assert args["pool-group"] == pool["apiVersion"].split("/")[0]
    epp = named(docs, "Deployment", "quill-epp")["spec"]["template"]["spec"]
    (container,) = epp["containers"]
    (mount,) = container["volumeMounts"]
    (volume,) = [v for v in epp["volumes"] if v["name"] == mount["name"]]
    config_map = named(docs, "ConfigMap", "quill-epp")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]  # the generator's hashed name
    path = Path(args["config-file"])
    assert path.parent == Path(mount["mountPath"]) and path.name in config_map["data"]
    assert yaml.safe_load(config_map["data"][path.name]) == yaml.safe_load(PICKER_CONFIG.read_text())
    assert {e["name"] for e in container["env"]} >= {"NAMESPACE"}, "the pool's namespace"


def test_picker_may_read_what_it_watches(docs):
    epp = named(docs, "Deployment", "quill-epp")["spec"]["template"]["spec"]
    account = named(docs, "ServiceAccount", epp["serviceAccountName"])["metadata"]["name"]
    binding = named(docs, "RoleBinding", "quill-epp")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    role = named(docs, "Role", binding["roleRef"]["name"])
    granted = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               if {"get", "list", "watch"} <= set(rule["verbs"])}
    assert {("", "pods"), ("inference.networking.k8s.io", "inferencepools")} <= granted


def test_route_sends_completions_to_the_pool(docs):
    from quill.server.api.app import create_app
    from quill.server.config import ServerConfig

    route = named(docs, "HTTPRoute", "quill")["spec"]
    pool_rules = [r for r in route["rules"] if any(b.get("kind") == "InferencePool" for b in r["backendRefs"])]
    (rule,) = pool_rules
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "quill"}]
    assert {m["path"]["value"] for m in rule["matches"]} == set(COMPLETION_PATHS)
    paths = create_app(None, ServerConfig()).openapi()["paths"]
    assert all("post" in paths[p] for p in COMPLETION_PATHS)
    (other,) = [r for r in route["rules"] if r is not rule]
    (backend,) = other["backendRefs"]
    service = named(docs, "Service", "quill")
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"] in {p["port"] for p in service["spec"]["ports"]}


# ---- the picker's configuration names what Quill exports --------------------------------------------

def test_picker_config_uses_known_plugins_and_refers_to_them():
    config = yaml.safe_load(PICKER_CONFIG.read_text())
    assert config["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1"
    assert config["kind"] == "EndpointPickerConfig"
    plugins = {p.get("name", p["type"]): p["type"] for p in config["plugins"]}
    assert set(plugins.values()) <= KNOWN_PLUGINS
    refs = [p["pluginRef"] for profile in config["schedulingProfiles"] for p in profile["plugins"]]
    for source in config["dataLayer"]["sources"]:
        refs += [source["pluginRef"]] + [e["pluginRef"] for e in source["extractors"]]
    assert set(refs) <= set(plugins)


def test_picker_reads_only_metrics_quill_exports():
    engine = picker_engine_config(yaml.safe_load(PICKER_CONFIG.read_text()))
    specs = picker_metrics(engine)
    assert {"queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "cacheInfoSpec"} <= set(specs)
    assert {name for name, _ in specs.values()} <= quill_sample_names()
    assert engine["loraSpec"] == "", "no LoRA adapters to report"


def test_picker_reads_the_cache_labels_quill_sets():
    engine = picker_engine_config(yaml.safe_load(PICKER_CONFIG.read_text()))
    kv_engine = SimpleNamespace(config=SimpleNamespace(cache=CacheConfig(block_size=16)), num_kv_blocks=256)
    labels = cache_config_labels(kv_engine)
    assert labels[engine["cacheBlockSizeLabelName"]] == "16"
    assert labels[engine["cacheNumBlocksLabelName"]] == "256"
