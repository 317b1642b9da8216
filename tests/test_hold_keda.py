"""Scale to zero and back in KEDA mode with KEDA's own operator, metrics adapter and HPA on a real control plane
(scheduler, controller-manager, kwok nodes), `autoscaler run` in keda mode, real Prometheus and the fake vLLM
server. The shipped ScaledObject (type external-push) at `minReplicaCount: 0`: the idle model's decision goes
to 0, KEDA's next poll scales the Deployment to 0; a request held at the admission endpoint makes
StreamIsActive push true and KEDA's push path scales 0 -> 1 at once (the polls are 15 s apart, as shipped),
and the request is admitted once the pod is Ready."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor as ThreadPool

import pytest

from loadtest.kube.controlplane import control_plane, gpu_node, model_deployment
from loadtest.kube.keda import keda
from loadtest.realservers import free_port

from loopthread import LoopThread
from servers import fake_model_server, prometheus
from test_admission import get
from test_controller import settings_for, start, stop_and_wait
from test_keda_kube import shipped_scaled_object

# KEDA must scale from zero within a second of the held request (issue 26).
MAX_WAKE_S = 1.0


@pytest.fixture(scope="module")
def cluster():
    with control_plane(with_pods=True, hpa_sync_s=2.0) as cp, keda(cp):
        cp.apply(gpu_node("gpu-0", gpus=8))
        yield cp


def deployment(cluster, ns: str) -> dict:
    return cluster.request("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/model")[1]


def wait_for(predicate, timeout_s: float, what: str, every_s: float = 0.2) -> float:
    """Seconds until predicate() holds; fails with `what` after timeout_s."""
    start_s = time.monotonic()
    while not predicate():
        assert time.monotonic() - start_s < timeout_s, what
        time.sleep(every_s)
    return time.monotonic() - start_s


def test_keda_scales_the_idle_model_to_zero_and_a_held_request_wakes_it_through_stream_is_active(cluster):
    ns = f"keda-zero-{int(time.time() * 1000) % 1000000}"
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    cluster.apply(model_deployment(ns, "model", 1, ready_delay="1s"))
    with fake_model_server() as model, prometheus([model.removeprefix("http://")]) as prom:
        settings = settings_for(ns, prom, "keda")
        settings = settings.model_copy(update={
            "policy": settings.policy.model_copy(update={"idle_after_s": 4.0}),
            "keda": settings.keda.model_copy(update={"port": free_port()}),
        })
        scaled = shipped_scaled_object(ns, "model", f"127.0.0.1:{settings.keda.port}")
        assert scaled["spec"]["pollingInterval"] == 15  # as shipped: a wake in 1 s cannot be a poll's
        scaled["spec"].update(minReplicaCount=0, cooldownPeriod=1)
        thread = LoopThread()
        stop, task = start(thread, settings, cluster.kubeconfig)
        endpoint = f"http://127.0.0.1:{settings.admission.port}/ext_authz/v1/completions"
        try:
            cluster.apply(scaled)
            down_s = wait_for(lambda: deployment(cluster, ns)["spec"]["replicas"] == 0, 60,
                              "KEDA never scaled the idle model to zero")
            wait_for(lambda: not deployment(cluster, ns).get("status", {}).get("readyReplicas"), 30,
                     "a pod stayed Ready at zero")
            time.sleep(2.0)  # a tick or two at zero: the decision says 0 Ready
            with ThreadPool() as pool:
                sent = time.monotonic()
                answer = pool.submit(get, endpoint, "standard")
                woke_s = wait_for(lambda: deployment(cluster, ns)["spec"]["replicas"] >= 1, 20,
                                  "the held request did not wake the model", every_s=0.02)
                assert not answer.done(), "admitted before a replica was Ready"
                status, _ = answer.result(60)
                admitted_s = time.monotonic() - sent
            ready = deployment(cluster, ns).get("status", {}).get("readyReplicas", 0)
        finally:
            stop_and_wait(thread, stop, task)
            thread.close()
            cluster.request("DELETE", f"/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledobjects/model")
            cluster.request("DELETE", f"/api/v1/namespaces/{ns}")
    print(f"KEDA: at zero {down_s:.1f} s after the ScaledObject; scaled 0 -> 1 {woke_s:.2f} s after the held "
          f"request; admitted after {admitted_s:.2f} s")
    assert status == 200 and ready >= 1
    assert woke_s < MAX_WAKE_S
