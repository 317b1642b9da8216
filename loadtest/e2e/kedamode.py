"""KEDA mode for a closed-loop scenario (`E2EConfig.mode == "keda"`): the controller only publishes its
decisions through its gRPC external scaler, and KEDA's operator, its metrics adapter and the HPA it creates
scale the model's Deployment, all on the scenario's control plane (`loadtest.kube.keda`).

- The shipped ScaledObject (`deploy/keda/scaledobject.yaml`, type `external-push`) is applied as a user
  would, pointed at the model and the scaler's port, with `minReplicaCount: 0` and its `pollingInterval` and
  `cooldownPeriod` divided by the time factor (KEDA takes whole seconds: rounded up, at least 1). The HPA
  controller syncs at the compressed rate (`stack.cluster`); the ScaledObject's HPA behavior is the shipped
  one (no stabilization, 1-s periods: nothing to compress).
- The wake is measured on the wall clock, which the compression does not touch: `ReplicaWatch` records each
  change of the Deployment's `spec.replicas` as the apiserver's watch delivers it (the timeline's samples,
  every 0.5 s, are too coarse for a 1-s bound), and `wake_figures` reads the time from the client's send of
  the first held request after the silence to the first `spec.replicas` above 0 after it. KEDA's push path
  (StreamIsActive says true as soon as a request is held) must do that within `checks.MAX_WAKE_S`; its poll
  alone would take up to a `pollingInterval`.
"""

from __future__ import annotations

import contextlib
import json
import math
import ssl
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from loadtest.e2e.config import E2EConfig
from loadtest.kube.controlplane import ControlPlane
from loadtest.kube.keda import keda
from loadtest.realservers import free_port

SHIPPED = Path(__file__).resolve().parent.parent.parent / "deploy" / "keda" / "scaledobject.yaml"
# the apiserver ends each watch after this (and `stop` waits for it); the next one resumes at its resourceVersion
WATCH_TIMEOUT_S = 2


def controller_section(port: int) -> dict:
    """The controller config's part for KEDA mode: publish only, the gRPC scaler on `port` (plaintext, loopback)."""
    return {"mode": "keda", "keda": {"port": port}}


def _compressed_s(value_s: float, factor: float) -> int:
    return max(1, math.ceil(value_s / factor))


def scaled_object(config: E2EConfig, *, namespace: str, name: str, scaler_address: str) -> dict:
    """The shipped ScaledObject for the Deployment `namespace/name`, at zero allowed, its periods compressed."""
    doc = yaml.safe_load(SHIPPED.read_text())
    spec = doc["spec"]
    doc["metadata"].update(name=name, namespace=namespace)
    spec["scaleTargetRef"]["name"] = name
    spec["triggers"][0]["metadata"]["scalerAddress"] = scaler_address
    spec["minReplicaCount"] = 0
    spec["maxReplicaCount"] = max(spec["maxReplicaCount"], config.max_replicas)
    for key in ("pollingInterval", "cooldownPeriod"):
        spec[key] = _compressed_s(spec[key], config.factor)
    return doc


class ReplicaWatch:
    """(wall clock, spec.replicas) at each change of one Deployment's replicas, from an apiserver watch run in a
    thread. A change missed while a watch is re-opened is recorded when the next one delivers it (late, never
    early: a wake time read from it is an upper bound)."""

    def __init__(self, cp: ControlPlane, *, namespace: str, name: str) -> None:
        self.cp, self.namespace, self.name = cp, namespace, name
        self.changes: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{name}", daemon=True)

    def start(self) -> "ReplicaWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=WATCH_TIMEOUT_S + 5)

    def _open(self, resource_version: str):
        path = (f"/apis/apps/v1/namespaces/{self.namespace}/deployments?watch=1"
                f"&fieldSelector=metadata.name%3D{self.name}&timeoutSeconds={WATCH_TIMEOUT_S}"
                + (f"&resourceVersion={resource_version}" if resource_version else ""))
        request = urllib.request.Request(self.cp.url + path, headers={"Authorization": f"Bearer {self.cp.token}"})
        return urllib.request.urlopen(request, context=ssl.create_default_context(cafile=self.cp.ca_file),
                                      timeout=WATCH_TIMEOUT_S + 5)

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                with self._open(version) as stream:
                    for line in stream:
                        event = json.loads(line)
                        if event.get("type") == "ERROR":  # e.g. 410 Gone: start again from the current state
                            version = ""
                            break
                        version = self._seen(event["object"])
            except (OSError, ValueError, KeyError):
                version = ""
                self._stop.wait(0.2)

    def _seen(self, deployment: dict) -> str:
        replicas = deployment.get("spec", {}).get("replicas")
        if replicas is not None and (not self.changes or self.changes[-1][1] != replicas):
            self.changes.append((time.time(), int(replicas)))
        return deployment["metadata"]["resourceVersion"]


@dataclass
class KedaMode:
    """What a KEDA-mode stack adds: the scaler's port (the controller's `keda.port`), the replicas' watch and
    the ScaledObject to apply."""

    port: int
    watch: ReplicaWatch
    scaled_object: dict

    def apply(self, cp: ControlPlane, *, timeout_s: float = 60.0) -> None:
        """Apply the ScaledObject and wait until KEDA reports it Ready (its HPA made, the scaler reached)."""
        cp.apply(self.scaled_object)
        meta = self.scaled_object["metadata"]
        path = f"/apis/keda.sh/v1alpha1/namespaces/{meta['namespace']}/scaledobjects/{meta['name']}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            conditions = {c["type"]: c["status"] for c in cp.request("GET", path)[1].get("status", {})
                          .get("conditions", [])}
            if conditions.get("Ready") == "True":
                return
            time.sleep(0.25)
        raise TimeoutError(f"ScaledObject {meta['name']} not Ready within {timeout_s:.0f} s: {conditions}")


@contextlib.contextmanager
def keda_mode(config: E2EConfig, cp: ControlPlane, *, namespace: str, name: str):
    """KEDA's operator and metrics adapter on `cp`, and the Deployment's replicas watched, until the block ends;
    yields a KedaMode whose ScaledObject the caller applies once the controller decides."""
    with keda(cp):
        port = free_port()
        watch = ReplicaWatch(cp, namespace=namespace, name=name).start()
        try:
            yield KedaMode(port, watch, scaled_object(config, namespace=namespace, name=name,
                                                      scaler_address=f"127.0.0.1:{port}"))
        finally:
            watch.stop()


def wake_figures(records: list[dict], changes: list[tuple[float, int]], *, start_at: float, factor: float,
                 after_s: float) -> dict:
    """`wake_to_scale_s`: wall-clock seconds from the client's send of the first held request sent from
    `after_s` on (scenario time) to the first change of `spec.replicas` above 0 after it; None if the
    Deployment was not at 0 then or never left it. `replicas_at_first_held`: its replicas then."""
    held = [r["sent_s"] for r in records if r["sent_s"] >= after_s and r.get("hold_s", 0.0) > 0]
    if not held:
        return {"wake_to_scale_s": None, "replicas_at_first_held": None}
    sent = start_at + min(held) / factor
    before = [replicas for t, replicas in changes if t <= sent]
    at_send = before[-1] if before else None
    woke = next((t for t, replicas in changes if t > sent and replicas > 0), None)
    took = round(woke - sent, 3) if at_send == 0 and woke is not None else None
    return {"wake_to_scale_s": took, "replicas_at_first_held": at_send}
