"""The closed loop in KEDA mode (`python -m loadtest.e2e --scenario scale-to-zero-keda`, `loadtest.e2e.kedamode`):
the shipped ScaledObject as the scenario applies it, the controller's config, the wake's wall-clock figure and
its check on hand-made records, and the replicas' watch against a real kube-apiserver. `make e2e` runs the
scenario itself."""

import time
from dataclasses import replace

import pytest
import yaml

from autoscaler.config import Settings
from loadtest.e2e import kedamode
from loadtest.e2e.checks import MAX_WAKE_S, CheckContext
from loadtest.e2e.config import E2EConfig
from loadtest.e2e.figures import annotate_holds, holds, wake
from loadtest.e2e.stack import controller_config
from loadtest.kube.controlplane import control_plane, model_deployment
from loadtest.scenarios import SCENARIOS

from test_e2e_zero import BURST_S, FACTOR, REQUESTS, _good

START_AT = 1_000_000.0  # the wall clock of scenario time 0 in the hand-made runs


def test_the_scenario_is_scale_to_zero_in_keda_mode():
    cold, keda = SCENARIOS["scale-to-zero"], SCENARIOS["scale-to-zero-keda"]
    assert cold.profile == keda.profile and cold.windows == keda.windows and keda.twin_checked
    assert dict(keda.config) == {**cold.config, "mode": "keda"}


@pytest.mark.parametrize("factor,polling_s,cooldown_s", [(10.0, 2, 3), (1.0, 15, 30), (100.0, 1, 1)])
def test_the_shipped_scaled_object_at_zero_with_its_periods_compressed(factor, polling_s, cooldown_s):
    shipped = yaml.safe_load(kedamode.SHIPPED.read_text())
    doc = kedamode.scaled_object(E2EConfig(factor=factor), namespace="llm", name="model",
                                 scaler_address="127.0.0.1:5000")
    spec = doc["spec"]
    assert (doc["metadata"]["name"], doc["metadata"]["namespace"], spec["scaleTargetRef"]["name"]) == (
        "model", "llm", "model")
    assert spec["minReplicaCount"] == 0 and shipped["spec"]["minReplicaCount"] == 1
    assert (spec["pollingInterval"], spec["cooldownPeriod"]) == (polling_s, cooldown_s)
    assert spec["triggers"] == [{**shipped["spec"]["triggers"][0],
                                 "metadata": {"scalerAddress": "127.0.0.1:5000"}}]
    assert spec["triggers"][0]["type"] == "external-push"  # the push path is what the scenario measures
    assert spec["advanced"] == shipped["spec"]["advanced"] and spec["fallback"] == shipped["spec"]["fallback"]
    assert spec["maxReplicaCount"] >= E2EConfig().max_replicas


def test_the_controller_publishes_over_grpc_in_keda_mode_and_scales_itself_otherwise():
    config = replace(E2EConfig(), **SCENARIOS["scale-to-zero-keda"].config)
    keda = Settings(**controller_config(config, prom="http://127.0.0.1:9", http_port=1, admission_port=2,
                                        keda_port=5000))
    assert keda.mode.value == "keda" and keda.keda.port == 5000 and keda.policy.idle_after_s == 30.0
    actuate = Settings(**controller_config(E2EConfig(), prom="http://127.0.0.1:9", http_port=1, admission_port=2))
    assert actuate.mode.value == "actuate"


def _wall(scenario_s: float) -> float:
    return START_AT + scenario_s / FACTOR


def _run(changes, records=None):
    """The figures and checks as `loadtest.e2e.run` makes them for a KEDA-mode run."""
    records, timeline = (records, _good()[1]) if records is not None else _good()
    annotate_holds(records, REQUESTS, server=E2EConfig().server, factor=FACTOR)
    doc = {**holds(records), **wake(records, timeline, after_s=BURST_S),
           **kedamode.wake_figures(records, changes, start_at=START_AT, factor=FACTOR, after_s=BURST_S),
           "simulated": {"node_timings": {"provisioning_p90_s": 410.0}}}
    scenario = SCENARIOS["scale-to-zero-keda"]
    context = CheckContext(doc=doc, timeline=timeline, events=[], records=records, logs={}, fleet_events=[],
                           config=replace(E2EConfig(factor=FACTOR), mode="keda"), sim=None, windows=scenario.windows)
    return doc, scenario.check(context)


def test_the_wake_is_timed_from_the_first_held_request_to_replicas_above_zero_on_the_wall_clock():
    # at zero from minute 20; the first held request is sent at minute 35; KEDA writes 1 then the HPA 4
    changes = [(_wall(0), 5), (_wall(20 * 60), 0), (_wall(BURST_S) + 0.25, 1), (_wall(BURST_S) + 2.0, 4)]
    doc, checks = _run(changes)
    assert doc["wake_to_scale_s"] == pytest.approx(0.25, abs=1e-3) and doc["replicas_at_first_held"] == 0
    assert all(c["passed"] for c in checks), checks
    assert "StreamIsActive" in checks[-1]["check"] and "0.25 s" in checks[-1]["detail"]


@pytest.mark.parametrize("changes,took,at_send", [
    ([(_wall(0), 5), (_wall(20 * 60), 0), (_wall(BURST_S) + 1.6, 1)], 1.6, 0),  # a poll's wake, not a push's
    ([(_wall(0), 5)], None, 5),  # never went to zero: nothing woke it
    ([(_wall(0), 5), (_wall(20 * 60), 0)], None, 0),  # never came back
    ([], None, None),  # no watch event at all
])
def test_a_slow_wake_or_none_at_all_fails_the_keda_check(changes, took, at_send):
    doc, checks = _run(changes)
    assert doc["wake_to_scale_s"] == (pytest.approx(took, abs=1e-3) if took else None)
    assert doc["replicas_at_first_held"] == at_send
    assert not checks[-1]["passed"], checks[-1]


def test_without_a_held_request_after_the_silence_there_is_no_wake_figure():
    records, _ = _good()
    unheld = [r for r in records if r["sent_s"] < BURST_S or r["sent_s"] > BURST_S + 500]
    changes = [(_wall(0), 5), (_wall(20 * 60), 0), (_wall(BURST_S) + 0.25, 1)]
    doc, checks = _run(changes, unheld)
    assert doc["wake_to_scale_s"] is None and doc["replicas_at_first_held"] is None and not checks[-1]["passed"]
    doc, checks = _run(changes)  # the same scale with the held requests there: a wake
    assert doc["wake_to_scale_s"] is not None and checks[-1]["passed"], checks[-1]


def test_the_watch_records_each_change_of_spec_replicas_with_its_wall_clock():
    with control_plane() as cp:
        cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "llm"}})
        cp.apply(model_deployment("llm", "model", 3))
        path = "/apis/apps/v1/namespaces/llm/deployments/model"
        watch = kedamode.ReplicaWatch(cp, namespace="llm", name="model").start()
        try:
            deadline = time.monotonic() + 10
            while not watch.changes and time.monotonic() < deadline:
                time.sleep(0.05)
            written = []
            # a label between the two: an event whose replicas did not change, not recorded
            label = {"metadata": {"labels": {"seen": "yes"}}}
            for patch in ({"spec": {"replicas": 0}}, label, {"spec": {"replicas": 2}}):
                time.sleep(0.3)
                written.append(time.time())
                assert cp.request("PATCH", path, patch)[0] == 200
            deadline = time.monotonic() + 10
            while len(watch.changes) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            watch.stop()
    assert [r for _, r in watch.changes] == [3, 0, 2]
    # each change arrives after its write, within the scenario's wake bound (a poll would take 2 s)
    assert written[0] <= watch.changes[1][0] < written[0] + MAX_WAKE_S
    assert written[2] <= watch.changes[2][0] < written[2] + MAX_WAKE_S


def test_a_mode_other_than_actuate_or_keda_is_refused():
    with pytest.raises(ValueError, match="'KEDA': choose one of actuate, keda"):
        E2EConfig(mode="KEDA")
