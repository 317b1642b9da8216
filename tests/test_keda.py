"""The KEDA external scaler, driven the way KEDA drives it."""

import math

import grpc
import pytest

from autoscaler.board import DecisionBoard, Published
from autoscaler.external_scaler import externalscaler_pb2 as pb
from autoscaler.external_scaler import externalscaler_pb2_grpc as pb_grpc
from autoscaler.external_scaler.server import start
from policies import Decision

from loopthread import LoopThread
from servers import free_port

REF = pb.ScaledObjectRef(name="llama", namespace="llm", scalerMetadata={"scalerAddress": "x"})


@pytest.fixture()
def scaler():
    thread = LoopThread()
    board = DecisionBoard()
    port = free_port()
    server = thread.run(start(board, host="127.0.0.1", port=port, namespace="llm", scaled_object="llama",
                              metric_name="desired-replicas"))
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.ExternalScalerStub(channel)
    yield thread, board, stub
    channel.close()
    thread.run(server.stop(None))
    thread.close()


def publish(thread, board, replicas, *, valid=True, current=5):
    thread.run(board.publish(Published(Decision(replicas=replicas, valid=valid), current, None, 0.0)))


def hpa_replicas(spec: pb.GetMetricSpecResponse, metrics: pb.GetMetricsResponse) -> int:
    """What KEDA's HPA computes for an AverageValue external metric (float fields preferred when > 0)."""
    target = spec.metricSpecs[0].targetSizeFloat or spec.metricSpecs[0].targetSize
    value = metrics.metricValues[0].metricValueFloat or metrics.metricValues[0].metricValue
    return math.ceil(value / target)


def test_polling_like_keda_follows_every_decision(scaler):
    thread, board, stub = scaler
    spec = stub.GetMetricSpec(REF)  # once
    assert spec.metricSpecs[0].metricName == "desired-replicas"
    for replicas in (3, 7, 12, 4, 0):
        publish(thread, board, replicas)
        metrics = stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=REF, metricName="desired-replicas"))
        active = stub.IsActive(REF).result
        assert hpa_replicas(spec, metrics) == replicas
        assert active == (replicas > 0)


def test_invalid_decision_publishes_what_runs(scaler):
    thread, board, stub = scaler
    publish(thread, board, 1, valid=False, current=9)
    metrics = stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=REF, metricName="desired-replicas"))
    assert metrics.metricValues[0].metricValueFloat == 9.0


def test_errors_carry_proper_status_codes(scaler):
    thread, board, stub = scaler
    with pytest.raises(grpc.RpcError) as err:
        stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=REF, metricName="desired-replicas"))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    publish(thread, board, 3)
    with pytest.raises(grpc.RpcError) as err:
        stub.GetMetricSpec(pb.ScaledObjectRef(name="other", namespace="llm"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as err:
        stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=REF, metricName="cpu"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as err:
        stub.IsActive(pb.ScaledObjectRef())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_stream_is_active_pushes_on_change(scaler):
    thread, board, stub = scaler
    publish(thread, board, 2)
    stream = stub.StreamIsActive(REF)
    assert next(stream).result is True
    publish(thread, board, 0)
    assert next(stream).result is False
    publish(thread, board, 5)
    assert next(stream).result is True
    stream.cancel()


def test_stream_metric_spec_sends_the_spec(scaler):
    thread, board, stub = scaler
    stream = stub.StreamMetricSpec(REF)
    assert next(stream).metricSpecs[0].targetSizeFloat == 1.0
    stream.cancel()
