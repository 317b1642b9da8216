"""The closed loop for a fleet of models on loopback: the single-model stack (`loadtest.e2e.stack`) with N
models under one fleet controller.

    control plane + Karpenter (one NodePool, its GPU limit = the fleet's budget)
    per model: its namespace, Deployment and ModelAutoscaler (tier, weight, the scenario's policy)
    one `autoscaler run` with `fleet.enabled` (actuate; `capacity.max_gpus` the budget; the warm pool pooled
        per replica shape in the controller's namespace, `POOL_NAMESPACE`)
    per model: a fleet of fake vLLM servers (loadtest.fleet), its own nginx upstream list and file_sd targets
        (labelled namespace and app, as the fleet controller's grouped PromQL splits them)
    nginx (the shipped gateway): each request's x-model-autoscaler picks the model's upstream and names the
        model to the admission endpoint; Prometheus over every model's servers

`FleetStack.sample()` reads one timeline row: per model what `Stack.sample` reads for one (the Deployment,
its pods, the controller's per-model metrics), plus the pooled placeholders and the nodes.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from autoscaler.crd import GROUP, VERSION
from autoscaler.kube.capacity import is_gpu_resource
from autoscaler.kube.deletion import LEAVING_TAINTS
from autoscaler.kube.pods import pod_facts
from autoscaler.kube.quantity import effective_resources
from loadtest.e2e.config import E2EConfig
from loadtest.e2e.stack import (PLACEHOLDER_CLASS, ControllerProcess, _ts, cluster, fake_servers_command,
                                model_deployment, wait_until)
from loadtest.gateway import gateway
from loadtest.kube.karpenter import POOL, POOL_LABEL
from loadtest.loadgen import PRIORITY_HEADER
from loadtest.realservers import free_port, prometheus, stop
from loadtest.scenarios import FleetModel

POOL_NAMESPACE = "fleet-ops"  # the fleet controller's Lease and its pooled warm placeholders
CRD_FILE = Path(__file__).resolve().parents[2] / "deploy" / "crds" / "modelautoscaler.yaml"


def fleet_deployment(config: E2EConfig, model: FleetModel, replicas: int) -> dict:
    """The single-model scenarios' Deployment (one GPU a replica, kwok-readied after the start-up), renamed."""
    doc = model_deployment(config, replicas)
    labels = {"app": model.name}
    doc["metadata"] = {"name": model.name, "namespace": model.namespace}
    doc["spec"]["selector"] = {"matchLabels": labels}
    doc["spec"]["template"]["metadata"]["labels"] = labels
    return doc


def model_autoscaler(config: E2EConfig, model: FleetModel) -> dict:
    """The model's ModelAutoscaler: the single-model scenarios' signals and compressed policy, its tier and
    weight. The SLO is on the queue wait, so its p99 is the latency signal (the simulator's too)."""
    f, ns = config.factor, model.namespace
    window_ms = round(config.rate_window_s / f * 1000)
    selector = f'namespace="{ns}",app="{model.name}"'
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelAutoscaler",
        "metadata": {"name": model.name, "namespace": ns},
        "spec": {
            "target": {"name": model.name}, "selector": {"matchLabels": {"app": model.name}},
            "tier": model.tier, "weight": model.weight,
            "signals": {"prometheus": {
                "timeout_s": max(0.2, config.tick_s / f / 3), "rate_window_s": config.rate_window_s / f,
                "queries": {"p99_latency_s": "histogram_quantile(0.99, sum by (le) (rate("
                            f"vllm:request_queue_time_seconds_bucket{{{selector}}}[{window_ms}ms])))"}}},
            # unset fields are left out (the schema fills in defaults; null is no value it takes)
            "policy": {k: v for k, v in config.live_spec().items() if v is not None},
        },
    }


def fleet_controller_config(config: E2EConfig, models: tuple[FleetModel, ...], *, prom: str, http_port: int,
                            admission_port: int) -> dict:
    f = config.factor
    return {
        # each model's endpoint probes its pods' queue and running requests, as the twin's request simulator
        # assumes (`probe_s`): the saturation guard, the overrun rule and the slots kept for the top class read it
        "fleet": {"enabled": True, "namespaces": sorted({m.namespace for m in models}),
                  "lease_namespace": POOL_NAMESPACE, "queue_probe": True},
        "mode": "actuate",
        "http_port": http_port,
        "prometheus": {"url": prom, "timeout_s": max(0.2, config.tick_s / f / 3)},
        "policy": {"tick_s": config.tick_s / f},
        "capacity": {"max_gpus": config.gpu_limit},
        "warm_pool": {"enabled": True, "priority_class": PLACEHOLDER_CLASS},
        "admission": {"port": admission_port, "queue_probe_interval_s": config.probe_s / f},
        "leader_election": {"lease_duration_s": 15.0 / f, "renew_deadline_s": 10.0 / f, "retry_period_s": 2.0 / f},
    }


def _metric(metrics: dict[str, float], name: str, model: FleetModel) -> float | None:
    """A per-model series of the fleet controller's /metrics (labels namespace and model_autoscaler)."""
    for key, value in metrics.items():
        if key.startswith(name + "{") and f'namespace="{model.namespace}"' in key \
                and f'model_autoscaler="{model.name}"' in key:
            return value
    return None


def _shed(metrics: dict[str, float], model: FleetModel) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        if key.startswith("autoscaler_shed_ratio{") and f'namespace="{model.namespace}"' in key \
                and f'model_autoscaler="{model.name}"' in key:
            out[key.split('priority="')[1].split('"')[0] if 'priority="' in key else key] = value
    return out


def pod_gpus(pod: dict) -> int:
    """GPUs a pod (its JSON form) requests, as the scheduler counts them."""
    requests, _ = effective_resources(pod.get("spec") or {})
    return int(sum(v for k, v in requests.items() if is_gpu_resource(k)))


def node_leaving(node: dict) -> bool:
    """Whether a node (its JSON form) is on its way out, so the scheduler places nothing new there: being
    deleted, cordoned, or tainted for removal (Karpenter taints a node it disrupts before deleting it)."""
    spec = node.get("spec") or {}
    return (node.get("metadata", {}).get("deletionTimestamp") is not None or bool(spec.get("unschedulable"))
            or any(t.get("key") in LEAVING_TAINTS for t in spec.get("taints") or []))


@dataclass
class FleetStack:
    config: E2EConfig
    models: tuple[FleetModel, ...]
    cp: object
    karpenter: object
    controller: ControllerProcess
    gateway_url: str
    work: Path
    started: float = 0.0
    # (kind, uid) -> {"created", "ready", "gone", "gpus", "name", "namespace", ...}; kind: model, placeholder,
    # node, claim (as `Stack.lifetimes`; a model pod's `namespace` names its model; a pod's `gpus` from its
    # requests; a node's `disrupted`: when it was first seen leaving; `gone`: when its deletion was first seen,
    # `vanished`: when the API server no longer listed it)
    lifetimes: dict = field(default_factory=dict)

    @property
    def controllers(self) -> list[ControllerProcess]:
        return [self.controller]

    def t(self) -> float:
        return (time.time() - self.started) * self.config.factor

    def _get(self, path: str) -> dict:
        status, body = self.cp.request("GET", path)
        return body if status == 200 else {}

    def _life(self, key: tuple, meta: dict, *, gpus: int, **extra) -> dict:
        return self.lifetimes.setdefault(key, {"created": _ts(meta["creationTimestamp"]), "ready": None,
                                               "gone": None, "gpus": gpus, "name": meta["name"], **extra})

    def _pods(self, now: float, seen: set) -> tuple[dict, dict]:
        """Each model's pods by state, and the pooled placeholders; their lifetimes kept."""
        by_model = {m.key: {"pending": 0, "starting": 0, "ready": 0} for m in self.models}
        pooled = {"pending": 0, "ready": 0}
        namespaces = {m.namespace for m in self.models} | {POOL_NAMESPACE}
        for ns in sorted(namespaces):
            for pod in self._get(f"/api/v1/namespaces/{ns}/pods").get("items", []):
                meta, facts = pod["metadata"], pod_facts(pod)
                model = next((m for m in self.models if m.namespace == ns and facts.labels.get("app") == m.name), None)
                key = ("model" if model else "placeholder", meta["uid"])
                seen.add(key)
                life = self._life(key, meta, gpus=pod_gpus(pod), namespace=ns)
                if facts.ready and life["ready"] is None:
                    life["ready"] = now
                if facts.deleting and life["gone"] is None:
                    life["gone"] = now
                if facts.node and "node" not in life:
                    life["node"], life["placed"] = facts.node, facts.placed_s or now
                if model is not None:
                    by_model[model.key]["ready" if facts.ready else ("starting" if facts.node else "pending")] += 1
                else:
                    pooled["ready" if facts.ready else "pending"] += 1
        return by_model, pooled

    def _nodes(self, now: float, seen: set) -> int:
        nodes = self._get(f"/api/v1/nodes?labelSelector={POOL_LABEL}%3D{POOL}").get("items", [])
        for node in nodes:
            gpus = int(node.get("status", {}).get("capacity", {}).get("nvidia.com/gpu", "0") or 0)
            seen.add(("node", node["metadata"]["uid"]))
            life = self._life(("node", node["metadata"]["uid"]), node["metadata"], gpus=gpus, disrupted=None)
            life["gpus"] = gpus  # a node may register before its capacity
            if life["disrupted"] is None and node_leaving(node):
                life["disrupted"] = now
        claims = self._get(f"/apis/karpenter.sh/v1/nodeclaims?labelSelector=karpenter.sh%2Fnodepool%3D{POOL}")
        for claim in claims.get("items", []):
            seen.add(("claim", claim["metadata"]["uid"]))
            self._life(("claim", claim["metadata"]["uid"]), claim["metadata"], gpus=self.config.node_shape.gpus)
        return len(nodes)

    def _unseen(self, now: float, seen: set) -> None:
        for key, life in self.lifetimes.items():
            if key not in seen:
                if life["gone"] is None:
                    life["gone"] = now
                # `gone` is when its deletion was first seen; a pod holds its GPUs through its grace period
                life.setdefault("vanished", now)

    def sample(self) -> dict:
        now = time.time()
        seen: set = set()
        pods, pooled = self._pods(now, seen)
        nodes = self._nodes(now, seen)
        self._unseen(now, seen)
        metrics = self.controller.metrics()
        models = {}
        for m in self.models:
            deploy = self._get(f"/apis/apps/v1/namespaces/{m.namespace}/deployments/{m.name}")
            models[m.key] = {
                "spec_replicas": deploy.get("spec", {}).get("replicas"), "pods": pods[m.key],
                "decided": _metric(metrics, "autoscaler_decided_replicas", m),
                "warm_decided": _metric(metrics, "autoscaler_warm_slots", m), "shed": _shed(metrics, m),
                "unschedulable": _metric(metrics, "autoscaler_unschedulable_replicas", m),
            }
        return {"t_s": (now - self.started) * self.config.factor, "models": models, "pooled": pooled,
                "nodes": nodes}

    def events(self) -> list[dict]:
        namespaces = sorted({m.namespace for m in self.models} | {POOL_NAMESPACE})
        return [e for ns in namespaces for e in self._get(f"/api/v1/namespaces/{ns}/events").get("items", [])]


def model_servers_command(config: E2EConfig, model: FleetModel, work: Path, *, kubeconfig: str,
                          nginx_pid: Path) -> list[str]:
    """The command line of the model's fake vLLM servers (`python -m loadtest.fleet`), the config's server
    arguments (its scheduling policy) included."""
    ns = model.namespace
    return fake_servers_command(config, kubeconfig=kubeconfig, namespace=ns, app=model.name,
                                targets=work / f"targets-{ns}.json", upstreams=work / f"upstreams-{ns}.conf",
                                nginx_pid=nginx_pid, events=work / f"fleet-{ns}.jsonl",
                                extra=("--target-label", f"app={model.name}"))


def _model_servers(config: E2EConfig, model: FleetModel, work: Path, *, kubeconfig: str, nginx_pid: Path
                   ) -> subprocess.Popen:
    """The model's fake vLLM servers, one per Ready pod, with its own upstream list and file_sd targets."""
    return subprocess.Popen(model_servers_command(config, model, work, kubeconfig=kubeconfig, nginx_pid=nginx_pid),
                            stdout=(work / f"fleet-{model.namespace}.log").open("w"), stderr=subprocess.STDOUT)


def _serving(path: Path) -> int:
    text = path.read_text().strip() if path.exists() else ""
    return len(json.loads(text)[0]["targets"]) if text not in ("", "[]") else 0


def _install(cp, config: E2EConfig, models: tuple[FleetModel, ...], initial: dict[str, int]) -> None:
    [crd] = cp.apply_yaml(CRD_FILE.read_text())
    cp.wait_established([crd["metadata"]["name"]])
    for ns in sorted({m.namespace for m in models} | {POOL_NAMESPACE}):
        cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    cp.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": PLACEHOLDER_CLASS},
              "value": -5, "preemptionPolicy": "Never", "globalDefault": False})
    for m in models:
        cp.apply(fleet_deployment(config, m, initial[m.key]))
        cp.apply(model_autoscaler(config, m))


@contextlib.contextmanager
def fleet_stack(config: E2EConfig, models: tuple[FleetModel, ...], work: Path, *, initial: dict[str, int]):
    """Everything up, each model at its `initial` replicas Ready and served, the fleet controller deciding
    every model; yields a FleetStack."""
    f = config.factor
    work.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as exit_stack:
        cp, karp = cluster(config, exit_stack)
        _install(cp, config, models, initial)
        upstreams = {m.key: work / f"upstreams-{m.namespace}.conf" for m in models}
        for path in upstreams.values():
            path.write_text("server 127.0.0.1:9 max_fails=0;\n")
        for m in models:
            (work / f"targets-{m.namespace}.json").write_text("[]")
        prom = exit_stack.enter_context(prometheus([], scrape_interval_s=config.scrape_s / f,
                                                   file_sd=work / "targets-*.json"))
        http, admission = free_port(), free_port()
        path = work / "controller-0.yaml"
        path.write_text(yaml.safe_dump(fleet_controller_config(config, models, prom=prom, http_port=http,
                                                               admission_port=admission)))
        controller = ControllerProcess("controller-0", path, http, admission, work / "controller-0.log")
        default_upstream = work / "upstreams-default.conf"
        default_upstream.write_text("server 127.0.0.1:9 max_fails=0;\n")
        url, nginx_pid = exit_stack.enter_context(gateway(
            admission=f"http://127.0.0.1:{admission}", upstreams=default_upstream, models=upstreams,
            trusted_priority_header=PRIORITY_HEADER))
        for m in models:
            exit_stack.callback(stop, _model_servers(config, m, work, kubeconfig=cp.kubeconfig, nginx_pid=nginx_pid))
        st = FleetStack(config, models, cp, karp, controller, url, work)
        total = sum(initial.values())
        wait_until(lambda: all(st.sample()["models"][m.key]["pods"]["ready"] >= initial[m.key] for m in models),
                   120 + 2 * (config.node_provisioning_s + config.startup_s * 1.5) / f,
                   what=f"{total} model replicas Ready")
        wait_until(lambda: all(_serving(work / f"targets-{m.namespace}.json") >= initial[m.key] for m in models),
                   120, what="every model served")  # wall clock: room for a loaded machine
        controller.start(cp.kubeconfig)
        exit_stack.callback(controller.stop)
        controller.wait_ready()
        yield st
        controller.stop()
        (work / "cluster-logs").mkdir(exist_ok=True)
        for log in Path(cp.tmp, "logs").glob("*.log"):
            (work / "cluster-logs" / log.name).write_bytes(log.read_bytes()[-2_000_000:])
