"""Scale to zero and back in actuate mode: `autoscaler run` against a real kube-apiserver (scheduler,
controller-manager, kwok nodes), real Prometheus and the fake vLLM server. With `min_replicas: 1` and
`idle_after_s`, an idle model goes to 0 replicas; a request at the admission endpoint is held, wakes the
loop at once, the target is scaled to 1 and the request is admitted once the pod is Ready."""

import time
from concurrent.futures import ThreadPoolExecutor as ThreadPool
import urllib.request

from test_controller import settings_for, spec_replicas, start, stack, stop_and_wait  # noqa: F401 (fixture)

from loopthread import LoopThread
from test_admission import get


def test_actuate_mode_goes_to_zero_and_a_held_request_wakes_it(stack):  # noqa: F811
    cluster, ns, model, prom = stack
    settings = settings_for(ns, prom, "actuate")
    settings = settings.model_copy(update={"policy": settings.policy.model_copy(update={"idle_after_s": 4.0})})
    thread = LoopThread()
    stop, task = start(thread, settings, cluster.kubeconfig)
    endpoint = f"http://127.0.0.1:{settings.admission.port}"
    try:
        deadline = time.monotonic() + 30
        while spec_replicas(cluster, ns) != 0:
            assert time.monotonic() < deadline, "never went to zero"
            time.sleep(0.5)
        time.sleep(2.0)  # a tick or two at zero: the decision now says 0 Ready
        sent = time.monotonic()
        with ThreadPool() as pool:
            answer = pool.submit(get, f"{endpoint}/ext_authz/v1/completions", "standard")
            while spec_replicas(cluster, ns) == 0:
                assert time.monotonic() - sent < 10, "the held request did not wake the model"
                time.sleep(0.05)
            woke_s = time.monotonic() - sent
            status, _ = answer.result(60)
            admitted_s = time.monotonic() - sent
        with urllib.request.urlopen(f"http://127.0.0.1:{settings.http_port}/metrics", timeout=5) as r:
            exposition = r.read().decode()
    finally:
        stop_and_wait(thread, stop, task)
        thread.close()
    print(f"scaled 0 -> 1 {woke_s:.2f} s after the held request; admitted after {admitted_s:.2f} s")
    assert status == 200
    assert woke_s < 2.0  # at once, not after the next tick and a confirmation
    assert 'autoscaler_admission_hold_seconds_count{outcome="admitted"} 1.0' in exposition
    # the hold counted by where the wake landed its first replica (the decision's wake_start), never unknown
    assert any(f'autoscaler_admission_wake_hold_seconds_count{{start="{start}"}} 1.0' in exposition
               for start in ("slot", "node")), exposition
