"""The whole closed loop on loopback, started and stopped here: everything real but the GPUs.

    control plane (etcd, apiserver, scheduler, controller-manager, kwok)  +  Karpenter (kwok provider)
    the model Deployment  <-  `autoscaler run` (actuate mode, its own process, a config file; two on one Lease)
                          <-  or KEDA's operator, adapter and HPA, fed by `autoscaler run` in keda mode
                              (`E2EConfig.mode`, `loadtest.e2e.kedamode`)
    fleet (loadtest.fleet: a fake vLLM server per Ready pod)  <-  nginx (the shipped gateway, auth_request
    to the controllers' admission endpoints)  <-  load generator (loadtest.loadgen)
    Prometheus (file_sd over the fleet)  ->  the controllers

`Stack.sample()` reads what a user would watch (the Deployment, its pods, the warm pool, nodes, the
controllers' metrics) into one row of the scenario's timeline.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from autoscaler.blas import uncapped
from autoscaler.kube.pods import pod_facts
from loadtest.e2e import kedamode
from loadtest.e2e.config import E2EConfig
from loadtest.gateway import gateway
from loadtest.kube.controlplane import ControlPlane, control_plane
from loadtest.kube.karpenter import POOL, POOL_LABEL, Karpenter, karpenter
from loadtest.loadgen import PRIORITY_HEADER
from loadtest.realservers import free_port, prometheus, stop, wait_http

NAMESPACE = "llm"
MODEL = "model"
PLACEHOLDER_CLASS = "inference-autoscaler-placeholder"
POOLED = "pooled-warm"  # the placeholders pooled for the model by the fleet, not by its controller
MODEL_PORT = 8000
# The control plane and Karpenter yield the CPU to the data path (gateway, servers, controller, load): at a
# time compression of 10, a 0.2-s stall of a model server is a 2-s queue wait, the whole SLO.
CONTROL_PLANE_NICENESS = 5
HPA_SYNC_S = 15.0  # kube-controller-manager's default HPA sync period (KEDA mode's HPA), divided by the factor there


def model_deployment(config: E2EConfig, replicas: int) -> dict:
    """The model: one GPU per replica (and CPU and memory a node must also have), kwok-readied after the
    compressed start-up time with the simulator's jitter."""
    f = config.factor
    low = config.startup_s * (1 - config.startup_jitter_ratio / 2) / f
    high = config.startup_s * (1 + config.startup_jitter_ratio) / f
    labels = {"app": MODEL}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": MODEL, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas, "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {
                    "pod-ready.stage.kwok.x-k8s.io/delay": f"{round(low * 1000)}ms",
                    "pod-ready.stage.kwok.x-k8s.io/jitter-delay": f"{round(high * 1000)}ms"}},
                "spec": {
                    "nodeSelector": {POOL_LABEL: POOL},
                    "terminationGracePeriodSeconds": 30,
                    "containers": [{
                        "name": "vllm", "image": "vllm/vllm-openai:latest",
                        "ports": [{"containerPort": MODEL_PORT}],
                        "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "32Gi"},
                                      "limits": {"nvidia.com/gpu": "1"}},
                    }],
                },
            },
        },
    }


def pooled_placeholders(config: E2EConfig, slots: int) -> dict:
    """Warm slots pooled for the model outside the controller's warm pool (`E2EConfig.pooled_warm_slots`): pause
    pods shaped like one replica at the placeholder priority, which the scheduler preempts for a replica; each
    keeps a GPU node up while the model is at zero."""
    pod = model_deployment(config, slots)["spec"]["template"]["spec"]
    labels = {"app": POOLED}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": POOLED, "namespace": NAMESPACE},
        "spec": {"replicas": slots, "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels},
                 "spec": {"nodeSelector": pod["nodeSelector"], "priorityClassName": PLACEHOLDER_CLASS,
                          "terminationGracePeriodSeconds": 0,
                          "containers": [{"name": "placeholder", "image": "registry.k8s.io/pause:3.10",
                                          "resources": pod["containers"][0]["resources"]}]}}},
    }


def controller_config(config: E2EConfig, *, prom: str, http_port: int, admission_port: int,
                      keda_port: int | None = None) -> dict:
    """`keda_port`: KEDA mode, the gRPC scaler's port; None: actuate mode."""
    f = config.factor
    return {
        "target": {"namespace": NAMESPACE, "name": MODEL},
        "mode": "actuate",
        **(kedamode.controller_section(keda_port) if keda_port is not None else {}),
        "http_port": http_port,
        "prometheus": {
            "url": prom, "selector": f'namespace="{NAMESPACE}"', "timeout_s": max(0.2, config.tick_s / f / 3),
            "rate_window_s": config.rate_window_s / f,
            # the SLO is on the queue wait: its p99 is the latency signal (the simulator's too)
            "queries": {"p99_latency_s": (
                "histogram_quantile(0.99, sum by (le) (rate(vllm:request_queue_time_seconds_bucket"
                f'{{namespace="{NAMESPACE}"}}[{round(config.rate_window_s / f * 1000)}ms])))')},
        },
        "scrape": {"port": MODEL_PORT},
        "policy": config.live_spec(),
        "warm_pool": {"enabled": True, "priority_class": PLACEHOLDER_CLASS},
        "admission": {"port": admission_port, "queue_probe_interval_s": config.probe_s / f,
                      **({"max_hold_s": config.max_hold_s / f} if config.max_hold_s is not None else {})},
        "leader_election": {"lease_duration_s": 15.0 / f, "renew_deadline_s": 10.0 / f, "retry_period_s": 2.0 / f},
    }


def fake_servers_command(config: E2EConfig, *, kubeconfig: str, namespace: str, app: str, targets: Path,
                         upstreams: Path, nginx_pid: Path, events: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """The command line of one model's fake vLLM servers (`python -m loadtest.fleet`), compressed by the
    config's factor, with its server arguments (the scheduling policy) and `extra` ones."""
    f = config.factor
    return [sys.executable, "-m", "loadtest.fleet", "--kubeconfig", kubeconfig, "--namespace", namespace,
            "--selector", f"app={app}", "--port", str(MODEL_PORT), "--concurrency", str(config.concurrency),
            "--time-scale", str(1 / f), "--poll-s", str(min(0.2, config.tick_s / f / 5)),
            "--drain-delay-s", str(config.drain_delay_s / f), "--targets-file", str(targets),
            "--upstreams-file", str(upstreams), "--nginx-pid-file", str(nginx_pid), "--events-file", str(events),
            *extra, *config.server_args()]


@dataclass
class ControllerProcess:
    """One `autoscaler run` process of the harness, with its config, ports and log (the control loop inside
    it is `autoscaler.loop.Controller`)."""

    name: str
    config_file: Path
    http_port: int
    admission_port: int
    log: Path
    proc: subprocess.Popen | None = None

    def start(self, kubeconfig: str) -> None:
        sink = self.log.open("a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "autoscaler", "run", "--config", str(self.config_file), "--kubeconfig", kubeconfig],
            stdout=sink, stderr=subprocess.STDOUT, env={**uncapped(os.environ), "POD_NAME": self.name})

    def wait_ready(self) -> None:
        wait_http(f"http://127.0.0.1:{self.http_port}/decided", timeout_s=60, proc=self.proc)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)

    def metrics(self) -> dict[str, float]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=1) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("autoscaler_") and " " in line:
                key, value = line.rsplit(" ", 1)
                try:
                    out[key] = float(value)
                except ValueError:
                    pass
        return out


@dataclass
class Stack:
    config: E2EConfig
    cp: ControlPlane
    karpenter: Karpenter
    controllers: list[ControllerProcess]
    gateway_url: str
    prometheus_url: str
    work: Path
    started: float = 0.0  # wall clock of scenario t = 0
    keda: kedamode.KedaMode | None = None  # KEDA mode: the scaler's port, the ScaledObject, the replicas' watch
    # (kind, uid) -> {"created", "ready", "gone", "gpus", ...}; kind: model, placeholder, node, claim
    lifetimes: dict = field(default_factory=dict)
    _listed_s: float | None = None  # when the last sample's listings began: what they did not show came after

    def t(self) -> float:
        """Scenario time at factor 1."""
        return (time.time() - self.started) * self.config.factor

    def leader(self) -> ControllerProcess | None:
        for c in self.controllers:
            if c.metrics().get("autoscaler_is_leader") == 1.0:
                return c
        return None

    def _get(self, path: str) -> dict:
        status, body = self.cp.request("GET", path)
        return body if status == 200 else {}

    def sample(self) -> dict:
        now = time.time()
        deploy = self._get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{MODEL}")
        pods = self._get(f"/api/v1/namespaces/{NAMESPACE}/pods").get("items", [])
        nodes = self._get(f"/api/v1/nodes?labelSelector={POOL_LABEL}%3D{POOL}").get("items", [])
        claims = self._get(f"/apis/karpenter.sh/v1/nodeclaims?labelSelector=karpenter.sh%2Fnodepool%3D{POOL}")
        listed = time.time()

        def when(stamp: float | None) -> float | None:  # an API time first seen in these listings
            return None if stamp is None else seen_between(stamp, self._listed_s, listed)

        model = {"pending": 0, "starting": 0, "ready": 0}
        warm = {"pending": 0, "ready": 0}
        pooled = {"pending": 0, "ready": 0}
        seen = set()
        for pod in pods:
            meta, facts = pod["metadata"], pod_facts(pod)
            kind = "model" if facts.labels.get("app") == MODEL else "placeholder"
            ready = facts.ready
            key = (kind, meta["uid"])
            seen.add(key)
            life = self.lifetimes.setdefault(key, {"created": when(_ts(meta["creationTimestamp"])), "ready": None,
                                                   "gone": None, "gpus": 1, "name": meta["name"]})
            if ready and life["ready"] is None:
                life["ready"] = now
                # the Ready condition's own time, narrowed by the listings (seen_between): a start-up's end
                # unbiased by the harness's sampling (the twin replays start-ups, figures.node_timings)
                life["ready_at"] = when(facts.ready_s)
            if facts.deleting and life["gone"] is None:
                life["gone"] = now
            if facts.node and "node" not in life:
                life["node"] = facts.node
                life["placed"] = when(facts.placed_s) or now
            if kind == "model":
                state = "ready" if ready else ("starting" if facts.node else "pending")
                model[state] += 1
            elif facts.labels.get("app") == POOLED:
                pooled["ready" if ready else "pending"] += 1
            else:
                warm["ready" if ready else "pending"] += 1
        for node in nodes:
            meta = node["metadata"]
            key = ("node", meta["uid"])
            seen.add(key)
            gpus = int(node.get("status", {}).get("capacity", {}).get("nvidia.com/gpu", "0") or 0)
            self.lifetimes.setdefault(key, {"created": when(_ts(meta["creationTimestamp"])), "ready": None,
                                            "gone": None, "gpus": gpus, "name": meta["name"]})
        for claim in claims.get("items", []):
            # What is paid: an instance from its launch (the NodeClaim) to its removal. The Node object only
            # appears once the instance registers, after its boot.
            meta = claim["metadata"]
            key = ("claim", meta["uid"])
            seen.add(key)
            self.lifetimes.setdefault(key, {"created": when(_ts(meta["creationTimestamp"])), "ready": None,
                                            "gone": None, "gpus": self.config.node_shape.gpus})
        for key, life in self.lifetimes.items():
            if key not in seen and life["gone"] is None:
                life["gone"] = now
        self._listed_s = now
        metrics = {}
        leader = None
        for c in self.controllers:
            m = c.metrics()
            if m.get("autoscaler_is_leader") == 1.0:
                leader, metrics = c.name, m
        if not metrics:
            for c in self.controllers:
                metrics = metrics or c.metrics()
        return {
            "t_s": (now - self.started) * self.config.factor,
            "spec_replicas": deploy.get("spec", {}).get("replicas"),
            "decided": metrics.get("autoscaler_decided_replicas"),
            "warm_decided": metrics.get("autoscaler_warm_slots"),
            "model": model, "warm": warm, "pooled": pooled, "nodes": len(nodes),
            "held": metrics.get("autoscaler_admission_held_requests"),
            "shed": {k.split('"')[1]: v for k, v in metrics.items() if k.startswith("autoscaler_shed_ratio{")},
            "unschedulable": metrics.get("autoscaler_unschedulable_replicas"),
            "leader": leader,
        }

    def events(self) -> list[dict]:
        return self._get(f"/api/v1/namespaces/{NAMESPACE}/events").get("items", [])


def seen_between(stamp: float, before_s: float | None, by_s: float) -> float:
    """When an event happened that the API stamps to the second, truncated (creationTimestamp, a condition's
    lastTransitionTime), and the harness first saw in listings done by `by_s`, not in those begun at
    `before_s` (None: no listing before): the middle of what both allow, [stamp, stamp + 1) and
    (before_s, by_s]. At factor 10 the truncated second is 10 s of the scenario, half of it early on average,
    as every start-up's end and node's arrival the twin replays was. Where the two disagree (an event before
    the listing that first showed it, e.g. a pod that was already there), the middle of the second."""
    low, high = max(stamp, before_s if before_s is not None else stamp), min(stamp + 1.0, by_s)
    return (low + high) / 2 if low <= high else stamp + 0.5


def _ts(text: str) -> float:
    from autoscaler.times import parse_time

    return parse_time(text)


def wait_until(predicate, timeout_s: float, step_s: float = 0.25, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step_s)
    raise TimeoutError(f"{what} not reached within {timeout_s:.0f} s")


def cluster(config: E2EConfig, exit_stack: contextlib.ExitStack) -> tuple:
    """The control plane and Karpenter (the NodePool's limit and timings compressed), stopped by `exit_stack`."""
    f = config.factor
    # the HPA controller's sync compressed only where an HPA runs (KEDA mode); the others run as measured
    hpa_sync_s = HPA_SYNC_S / f if config.mode == "keda" else HPA_SYNC_S
    cp = exit_stack.enter_context(control_plane(with_pods=True, niceness=CONTROL_PLANE_NICENESS,
                                                hpa_sync_s=hpa_sync_s))
    karp = exit_stack.enter_context(karpenter(
        cp, shape=config.node_shape, gpu_limit=config.gpu_limit, node_start_s=config.node_provisioning_s / f,
        consolidate_after_s=config.node_idle_s / f))
    return cp, karp


@contextlib.contextmanager
def stack(config: E2EConfig, work: Path, *, initial_replicas: int, controllers: int = 1):
    """Everything up, the model at `initial_replicas` Ready, the controllers deciding; yields a Stack."""
    f = config.factor
    if config.mode == "keda" and controllers > 1:
        raise ValueError("KEDA mode runs one controller: KEDA's scaler port is one per scenario")
    work.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as exit_stack:
        cp, karp = cluster(config, exit_stack)
        cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        cp.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                  "metadata": {"name": PLACEHOLDER_CLASS}, "value": -5, "preemptionPolicy": "Never",
                  "globalDefault": False})
        cp.apply(model_deployment(config, initial_replicas))
        if config.pooled_warm_slots:
            cp.apply(pooled_placeholders(config, config.pooled_warm_slots))
        keda = (exit_stack.enter_context(kedamode.keda_mode(config, cp, namespace=NAMESPACE, name=MODEL))
                if config.mode == "keda" else None)
        targets = work / "targets.json"
        upstreams = work / "upstreams.conf"
        targets.write_text("[]")
        upstreams.write_text("server 127.0.0.1:9 max_fails=0;\n")
        prom = exit_stack.enter_context(prometheus([], scrape_interval_s=config.scrape_s / f, file_sd=targets))
        ctrls = []
        for i in range(controllers):
            http, admission = free_port(), free_port()
            path = work / f"controller-{i}.yaml"
            path.write_text(yaml.safe_dump(controller_config(config, prom=prom, http_port=http,
                                                             admission_port=admission,
                                                             keda_port=keda.port if keda else None)))
            ctrls.append(ControllerProcess(f"controller-{i}", path, http, admission, work / f"controller-{i}.log"))
        url, nginx_pid = exit_stack.enter_context(gateway(
            admission=[f"http://127.0.0.1:{c.admission_port}" for c in ctrls], upstreams=upstreams,
            trusted_priority_header=PRIORITY_HEADER))
        fleet = subprocess.Popen(
            fake_servers_command(config, kubeconfig=cp.kubeconfig, namespace=NAMESPACE, app=MODEL, targets=targets,
                                 upstreams=upstreams, nginx_pid=nginx_pid, events=work / "fleet.jsonl",
                                 extra=("--service-port", str(free_port()),
                                        *(("--service-only",) if config.holding else ()))),
            stdout=(work / "fleet.log").open("w"), stderr=subprocess.STDOUT)
        exit_stack.callback(stop, fleet)
        st = Stack(config, cp, karp, ctrls, url, prom, work, keda=keda)
        wait_until(lambda: st.sample()["model"]["ready"] >= initial_replicas, 120 + 2 * (config.node_provisioning_s
                   + config.startup_s * 1.5) / f, what=f"{initial_replicas} model replicas Ready")
        wait_until(lambda: st.sample()["pooled"]["ready"] >= config.pooled_warm_slots,
                   120 + 2 * config.node_provisioning_s / f, what=f"{config.pooled_warm_slots} pooled warm slots Ready")
        wait_until(lambda: len(json.loads(targets.read_text() or "[]")[0]["targets"]) >= initial_replicas
                   if targets.read_text().strip() not in ("", "[]") else False, 120,
                   what="the fleet serving")  # wall clock: room for a loaded machine, as the fleet stack
        for c in ctrls:
            c.start(cp.kubeconfig)
            exit_stack.callback(c.stop)
        for c in ctrls:
            c.wait_ready()
        if keda is not None:
            keda.apply(cp)
        yield st
        for c in ctrls:
            c.stop()
        (work / "cluster-logs").mkdir(exist_ok=True)
        for log in Path(cp.tmp, "logs").glob("*.log"):
            (work / "cluster-logs" / log.name).write_bytes(log.read_bytes()[-2_000_000:])
