"""An old decision is not served for ever, and readiness means serving.

A decision older than `stale_after_ticks` ticks (the ticks stopped publishing) is stale: the admission
endpoint admits, the KEDA scaler answers UNAVAILABLE (so KEDA's fallback applies), and both count it in
metrics. The controller is ready (in its Service) as soon as its servers listen: before the first decision
its admission endpoint admits, which is the right answer; /decided says whether a fresh decision exists.
Timelines on the manual clock, through the real gRPC and HTTP servers.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
import yaml
from aiohttp import web

from autoscaler.admission import Admission
from autoscaler.board import Published
from autoscaler.clock import ManualClock
from autoscaler.config import ConfigError, Settings, load_config
from autoscaler.external_scaler import externalscaler_pb2 as pb
from autoscaler.external_scaler import externalscaler_pb2_grpc as pb_grpc
from autoscaler.external_scaler.server import start
from autoscaler.metrics import ControllerMetrics
from autoscaler.runtime import decision_board, health_app
from policies import PRIORITY_CLASSES, Decision

from loopthread import LoopThread
from servers import free_port

T0 = 1_000_000.0
TICK_S = 15.0
STALE_AFTER_TICKS = 4  # 60 s
REF = pb.ScaledObjectRef(name="llama", namespace="llm")
METRICS_REQUEST = pb.GetMetricsRequest(scaledObjectRef=REF, metricName="desired-replicas")


def settings(**extra) -> Settings:
    return Settings(target={"namespace": "llm", "name": "llama"}, prometheus={"url": "http://prom:9090"},
                    policy={"tick_s": TICK_S}, stale_after_ticks=STALE_AFTER_TICKS, **extra)


@pytest.fixture()
def wired():
    """The board as `autoscaler run` wires it (stale after 4 ticks of 15 s), on a manual clock."""
    thread, clock, metrics = LoopThread(), ManualClock(T0), ControllerMetrics()
    board = decision_board(settings(), metrics=metrics, clock=clock)
    yield SimpleNamespace(thread=thread, clock=clock, metrics=metrics, board=board)
    thread.close()


def publish(w, replicas: int = 4, **decision) -> None:
    published = Published(Decision(replicas=replicas, **decision), replicas, None, w.clock.now())
    w.thread.run(w.board.publish(published))


def advance(w, seconds: float) -> None:
    w.thread.run(w.clock.advance(seconds))


def stale_answers(w, server: str) -> float:
    return w.metrics.registry.get_sample_value("autoscaler_stale_decision_answers_total", {"server": server}) or 0.0


def test_the_admission_endpoint_admits_and_counts_a_stale_decision(wired):
    w = wired
    admission = Admission(w.board, priorities=dict(PRIORITY_CLASSES), header="p", default_class="standard",
                          retry_after_s=5, clock=w.clock)
    publish(w, shed={"sheddable": 1.0})
    advance(w, STALE_AFTER_TICKS * TICK_S)  # 60 s: the limit, still served
    assert admission.rejection("sheddable") is not None
    assert w.metrics.registry.get_sample_value("autoscaler_decision_age_seconds") == 60.0
    advance(w, 1.0)  # the ticks stopped: 61 s old
    assert [admission.rejection("sheddable") for _ in range(3)] == [None] * 3
    assert stale_answers(w, "admission") == 3
    assert w.metrics.registry.get_sample_value("autoscaler_decision_age_seconds") == 61.0
    publish(w, shed={"sheddable": 1.0})  # a tick again: shedding resumes
    assert admission.rejection("sheddable") is not None
    assert stale_answers(w, "admission") == 3


@pytest.fixture()
def keda(wired):
    port = free_port()
    server = wired.thread.run(start(wired.board, host="127.0.0.1", port=port, namespace="llm",
                                    scaled_object="llama", metric_name="desired-replicas"))
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield wired, pb_grpc.ExternalScalerStub(channel)
    channel.close()
    wired.thread.run(server.stop(None))


def code(call) -> grpc.StatusCode | None:
    try:
        call()
    except grpc.RpcError as err:
        return err.code()
    return None


def test_keda_gets_unavailable_for_no_decision_and_for_a_stale_one(keda):
    w, stub = keda
    assert code(lambda: stub.GetMetrics(METRICS_REQUEST)) == grpc.StatusCode.UNAVAILABLE
    # not "inactive" (which lets KEDA scale to zero): it does not know yet
    assert code(lambda: stub.IsActive(REF)) == grpc.StatusCode.UNAVAILABLE
    publish(w, 7)
    advance(w, 59.0)
    assert stub.GetMetrics(METRICS_REQUEST).metricValues[0].metricValueFloat == 7.0
    assert stub.IsActive(REF).result is True
    advance(w, 2.0)
    with pytest.raises(grpc.RpcError) as err:
        stub.GetMetrics(METRICS_REQUEST)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "61 s old" in err.value.details()
    assert code(lambda: stub.IsActive(REF)) == grpc.StatusCode.UNAVAILABLE
    assert stale_answers(w, "keda") == 2
    publish(w, 9)
    assert stub.GetMetrics(METRICS_REQUEST).metricValues[0].metricValueFloat == 9.0


def test_stream_is_active_says_nothing_until_a_fresh_decision(keda):
    w, stub = keda
    stream = stub.StreamIsActive(REF)
    publish(w, 3)  # the first thing the stream says comes from a decision
    assert next(stream).result is True
    advance(w, 61.0)
    publish(w, 0)
    assert next(stream).result is False
    stream.cancel()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_ready_means_serving_and_decided_says_whether_a_fresh_decision_exists(wired):
    w, port, serving = wired, free_port(), [False]
    controller = SimpleNamespace(settings=settings(), last_tick_s=None)

    async def serve():
        app = health_app(controller, w.metrics, w.board, w.clock, w.clock.now(), serving=lambda: serving[0])
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    runner = w.thread.run(serve())
    url = f"http://127.0.0.1:{port}"
    try:
        assert get(f"{url}/readyz")[0] == 503  # the admission and KEDA servers are not listening yet
        serving[0] = True
        assert get(f"{url}/readyz") == (200, "ok\n")  # before any decision: admission admits, so ready
        assert get(f"{url}/decided") == (503, "no decision yet\n")
        publish(w)
        advance(w, 30.0)
        assert get(f"{url}/decided") == (200, "decision 30 s old\n")
        advance(w, 31.0)
        assert get(f"{url}/decided") == (503, "decision 61 s old, stale after 60 s\n")
        assert get(f"{url}/readyz")[0] == 200
    finally:
        w.thread.run(runner.cleanup())


def test_the_shipped_readiness_probe_is_the_serving_one():
    deployment = yaml.safe_load((Path(__file__).resolve().parent.parent / "deploy/base/deployment.yaml").read_text())
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


@pytest.mark.parametrize("extra,match", [
    ({"stale_after_ticks": 1}, r"field 'stale_after_ticks'.*greater than or equal to 2.*got 1"),
    ({"stale_after_ticks": 0}, r"field 'stale_after_ticks'.*got 0"),
    ({"stale_after_ticks": "soon"}, r"field 'stale_after_ticks'.*got 'soon'"),
    ({"stale_after_ticks": 10_000}, r"field 'stale_after_ticks'.*less than or equal to 1000"),
    ({"admission": {"unknown_priority": "gold"}}, r"admission.unknown_priority 'gold' is not one of"),
    ({"policy": {"priorities": {"batch": -1, "Batch": 0, "top": 1}}, "admission": {"default_priority": "top"}},
     r"names must differ in more than case"),
])
def test_invalid_settings_name_the_field(tmp_path, extra, match):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"target": {"namespace": "llm", "name": "m"},
                                    "prometheus": {"url": "http://prom:9090"}, **extra}))
    with pytest.raises(ConfigError, match=match):
        load_config(path)


def test_the_defaults_validate():
    s = settings()
    assert s.stale_after_ticks == 4 and s.admission.unknown_priority is None
