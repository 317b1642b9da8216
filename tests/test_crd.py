"""The ModelAutoscaler CRD on a real kube-apiserver: accepted, and rejecting the same bad specs as the models."""

import copy
import json
import ssl
import urllib.request

import pytest
import yaml

from autoscaler.crd import GROUP, PLURAL, VERSION, parse_spec, render, settings_for
from autoscaler.errors import ConfigError

from helpers import ROOT
from overlays import find, render_overlay

NS = "llm"
CRD_FILE = ROOT / "deploy" / "crds" / "modelautoscaler.yaml"
COLLECTION = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}"
VALID = {"target": {"kind": "Deployment", "name": "llama-3-8b"}, "modelServer": "vllm",
         "selector": {"matchLabels": {"app": "llama-3-8b"}}, "tier": 0, "weight": 2.5,
         "signals": {"prometheus": {"queries": {"queue_depth": "sum(q)", "arrival_rate_critical": "sum(r)"}}},
         "policy": {"min_replicas": 1, "max_replicas": 8, "tick_s": 15},
         "budget": {"maxGPUs": 16, "kueueQueue": "models"}}


def with_(path: str, value) -> dict:
    """VALID with one field (a dotted path; value None deletes it) changed."""
    spec = copy.deepcopy(VALID)
    *parents, leaf = path.split(".")
    node = spec
    for name in parents:
        node = node.setdefault(name, {})
    if value is None:
        del node[leaf]
    else:
        node[leaf] = value
    return spec


BAD = {
    "negative min_replicas": with_("policy.min_replicas", -1),
    "max_replicas 0": with_("policy.max_replicas", 0),
    "replicas as a string": with_("policy.max_replicas", "10"),
    "tier not an int": with_("tier", "high"),
    "negative tier": with_("tier", -1),
    "weight 0 (exclusive bound)": with_("weight", 0),
    "unknown preset": with_("modelServer", "ollama"),
    "target kind DaemonSet": with_("target.kind", "DaemonSet"),
    "no target": with_("target", None),
    "empty target name": with_("target.name", ""),
    "min > max (CEL)": with_("policy.min_replicas", 9),
    "forecast bucket < tick (CEL)": with_("policy.forecast_bucket_s", 10),
    "saturation ratios crossed (CEL)": with_("policy.saturation_wait_ratio", 0.9),
    "guarding the highest class (CEL)": with_("policy.priorities", {"critical": 0}),
    "shedding the highest class (CEL)": with_("policy", {"priorities": {"critical": 0}, "guard_priority_below": 0,
                                                         "shed_priority_below": 1}),
    "no priority class": with_("policy.priorities", {}),
    "tick_s below 1 s": with_("policy.tick_s", 0.5),
    "slo miss ratio 0.5 (exclusive)": with_("policy.slo_miss_target_ratio", 0.5),
    "negative maxGPUs": with_("budget.maxGPUs", -1),
    "scrape port 70000": with_("signals.scrape.port", 70000),
    "query for an unknown signal (CEL)": with_("signals.prometheus.queries", {"queue_depht": "sum(q)"}),
    "query for an unknown class (CEL)": with_("signals.prometheus.queries", {"arrival_rate_gold": "sum(r)"}),
    "65 query overrides (at most 64)": with_("signals.prometheus.queries", {f"arrival_rate_c{i}": "sum(r)"
                                                                          for i in range(65)}),
    "prometheus url not http (CEL)": with_("signals.prometheus.url", "prometheus:9090"),
    "unknown field in spec": with_("replicas", 3),
    "unknown field in policy": with_("policy.max_replica", 3),
    "snake_case key of a camelCase field": with_("model_server", "vllm"),
}


def obj(name: str, spec: dict) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelAutoscaler", "metadata": {"name": name}, "spec": spec}


@pytest.fixture(scope="module")
def apiserver():
    """One control plane for the module (an apiserver is all this needs), the CRD as committed installed."""
    from loadtest.kube.controlplane import control_plane

    with control_plane() as cp:
        [crd_doc] = cp.apply_yaml(CRD_FILE.read_text())
        cp.wait_established([crd_doc["metadata"]["name"]])
        assert cp.request("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})[0] == 201
        yield cp


def test_committed_crd_is_the_generators_output():
    assert CRD_FILE.read_text() == render(), "regenerate: python -m autoscaler.crd > deploy/crds/modelautoscaler.yaml"


def test_crd_is_structural_and_has_printer_columns(apiserver):
    status, body = apiserver.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{PLURAL}.{GROUP}")
    assert status == 200
    conditions = {c["type"]: c for c in body["status"]["conditions"]}
    assert "NonStructuralSchema" not in conditions and conditions["Established"]["status"] == "True"
    [version] = body["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Target", "Tier", "Replicas", "Warm", "Shed", "Lead-s", "Active", "Age"]


def test_valid_object_is_created_and_defaulted_like_the_model(apiserver):
    status, body = apiserver.request("POST", COLLECTION + "?fieldValidation=Strict", obj("llama", VALID))
    assert status == 201, body.get("message")
    # the apiserver filled in the schema's defaults: the same values the model gives the fields left out
    assert body["spec"]["policy"]["replica_concurrency"] == 16 and body["spec"]["signals"]["scrape"]["port"] == 8000
    assert parse_spec(body["spec"]) == parse_spec(VALID)
    # without strict field validation an unknown field is pruned (and never reaches the controller)
    status, body = apiserver.request("POST", COLLECTION, obj("pruned", {**VALID, "replicas": 3}))
    assert status == 201 and "replicas" not in body["spec"]


def apiserver_rejects(cp, name: str, spec: dict) -> bool:
    status, body = cp.request("POST", COLLECTION + "?fieldValidation=Strict", obj(name, spec))
    if status == 201:
        cp.request("DELETE", f"{COLLECTION}/{name}")
    assert status in (201, 400, 422), body
    return status != 201


def model_rejects(spec: dict) -> bool:
    try:
        parse_spec(spec)
    except ConfigError:
        return True
    return False


def test_bad_specs_are_rejected_by_the_apiserver_and_by_the_model(apiserver):
    rows = [(label, apiserver_rejects(apiserver, f"bad-{i}", spec), model_rejects(spec))
            for i, (label, spec) in enumerate(BAD.items())]
    width = max(len(label) for label in BAD)
    print(f"\n{'bad spec':<{width}}  apiserver  model")
    for label, by_apiserver, by_model in rows:
        shown = ["rejects" if rejected else "ACCEPTS" for rejected in (by_apiserver, by_model)]
        print(f"{label:<{width}}  {shown[0]:<9}  {shown[1]}")
    print(f"{'rejected, of ' + str(len(rows)):<{width}}  {sum(r[1] for r in rows):<9}  {sum(r[2] for r in rows)}")
    assert [label for label, a, m in rows if not (a and m)] == []


def test_status_is_written_through_the_status_subresource_only(apiserver):
    status, created = apiserver.request("POST", COLLECTION, obj("status-demo", VALID))
    assert status == 201, created
    decided = {"observedGeneration": 1, "replicas": 3, "warmSlots": 1, "shedFractions": {"sheddable": 0.25},
               "leadTimeSeconds": 420.0, "reasons": ["forecast"], "lastDecisionTime": "2026-01-01T00:00:00Z",
               "conditions": [{"type": "Active", "status": "True", "reason": "Deciding", "message": "",
                               "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    status, body = apiserver.request("PUT", f"{COLLECTION}/status-demo/status", {**created, "status": decided})
    assert status == 200, body.get("message")
    # a status outside its schema is refused too
    bad = {**created, "metadata": body["metadata"], "status": {**decided, "replicas": -1}}
    assert apiserver.request("PUT", f"{COLLECTION}/status-demo/status", bad)[0] == 422
    # writing the main resource does not change the status
    body["status"] = {"replicas": 99}
    assert apiserver.request("PUT", f"{COLLECTION}/status-demo", body)[0] == 200
    read = apiserver.request("GET", f"{COLLECTION}/status-demo")[1]
    assert read["status"]["replicas"] == 3 and read["status"]["shedFractions"] == {"sheddable": 0.25}
    # the printer columns' paths find the values (what `kubectl get modelautoscalers` shows)
    status, table = table_of(apiserver, f"{COLLECTION}/status-demo")
    assert status == 200
    cells = dict(zip([c["name"] for c in table["columnDefinitions"]], table["rows"][0]["cells"]))
    assert (cells["Target"], cells["Replicas"], cells["Warm"], cells["Active"]) == ("llama-3-8b", 3, 1, "True")


def table_of(cp, path: str) -> tuple[int, dict]:
    request = urllib.request.Request(cp.url + path, headers={
        "Authorization": f"Bearer {cp.token}", "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=cp.ca_file), timeout=10) as r:
        return r.status, json.loads(r.read())


def test_spec_maps_onto_one_models_settings(monkeypatch):
    monkeypatch.setenv("AUTOSCALER_POLICY__MAX_REPLICAS", "2")  # the process's environment is not the object's
    settings = settings_for(namespace=NS, spec=parse_spec(VALID), base={"mode": "actuate",
                            "prometheus": {"url": "http://prometheus:9090"}})
    assert (settings.target.namespace, settings.target.name, settings.mode.value) == (NS, "llama-3-8b", "actuate")
    assert settings.policy.max_replicas == 8 and settings.capacity.max_gpus == 16
    assert settings.prometheus.url == "http://prometheus:9090"
    assert settings.queries["in_flight"] == 'sum(vllm:num_requests_running{namespace="llm",app="llama-3-8b"})'
    # what needs the process's config is checked here: no signal source, an admission class the policy lacks
    with pytest.raises(ConfigError, match="no signal source"):
        settings_for(namespace=NS, spec=parse_spec(VALID))
    with pytest.raises(ConfigError, match="default_priority"):
        settings_for(namespace=NS, spec=parse_spec({**with_("policy.priorities", {"gold": 1, "bronze": 0}),
                                                    "signals": {}}),
                     base={"prometheus": {"url": "http://prometheus:9090"}})


def test_fleet_crd_component_grants_reading_objects_and_writing_status_only(apiserver, tmp_path):
    docs = render_overlay(tmp_path, namespace=NS, model="llama", components=("fleet-crd", "model-name"))
    sa, role, binding = (find(docs, "ServiceAccount"), find(docs, "ClusterRole"), find(docs, "ClusterRoleBinding"))
    for doc in (sa, role, binding):
        apiserver.apply(doc, namespace=NS)
    base_role = find(render_overlay(tmp_path / "base", namespace=NS, model="llama"), "ClusterRole")
    assert not any(GROUP in r["apiGroups"] for r in base_role["rules"])  # the base stays least privilege
    user = f"system:serviceaccount:{NS}:{sa['metadata']['name']}"
    every = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
    allowed = {
        ("list", every): True, ("watch", every): True, ("get", f"{COLLECTION}/x"): True,
        ("update", f"{COLLECTION}/x/status"): True, ("patch", f"{COLLECTION}/x/status"): True,
        ("update", f"{COLLECTION}/x"): False, ("create", COLLECTION): False, ("delete", f"{COLLECTION}/x"): False,
    }
    got = {key: can(apiserver, user, *key) for key in allowed}
    assert got == allowed


def can(cp, user: str, verb: str, path: str) -> bool:
    """SubjectAccessReview: may `user` do `verb` on the resource at `path`?"""
    parts = path.split("/")  # /apis/GROUP/VERSION[/namespaces/NS]/PLURAL[/NAME[/SUB]]
    rest = parts[4:]
    namespace = ""
    if rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    attributes = {"verb": verb, "group": GROUP, "version": VERSION, "resource": rest[0], "namespace": namespace,
                  "name": rest[1] if len(rest) > 1 else "", "subresource": rest[2] if len(rest) > 2 else ""}
    status, body = cp.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                              {"spec": {"user": user, "groups": ["system:serviceaccounts"],
                                        "resourceAttributes": attributes}})
    assert status == 201, body
    return body["status"].get("allowed", False)


def test_documented_example_is_valid_for_both(apiserver):
    text = (ROOT / "docs" / "fleet-api.md").read_text()
    example = yaml.safe_load(text.split("```yaml\n", 1)[1].split("```", 1)[0])
    assert example["kind"] == "ModelAutoscaler"
    parse_spec(example["spec"])
    status, body = apiserver.request("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{example['metadata']['namespace']}"
                                     f"/{PLURAL}?fieldValidation=Strict", example)
    assert status == 201, body.get("message")
