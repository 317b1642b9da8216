"""The scale-to-zero scenarios' figures and checks (`python -m loadtest.e2e --scenario scale-to-zero`, and
`scale-to-zero-warm` with a warm slot pooled for the model), on hand-made records and timelines: runs nothing
live (`make e2e` runs the scenarios)."""

from dataclasses import replace

import pytest

from loadtest.e2e.checks import CheckContext
from loadtest.e2e.config import E2EConfig
from loadtest.e2e.figures import annotate_holds, client_figures, holds, wake
from loadtest.loadgen import Request
from loadtest.scenarios import SCENARIOS

FACTOR = 10.0
BURST_S = 35 * 60.0


def _record(i, sent_s, *, status=200, queue_s=0.0, latency_s=10.5, retry_after=None, cls="critical"):
    return {"i": i, "class": cls, "sent_s": sent_s, "status": status, "queue_s": queue_s if status == 200 else None,
            "latency_s": latency_s, "retry_after": retry_after}


# 1000 input and 500 output tokens: 0.1 + 10 s in a slot at the server's per-token times
REQUESTS = {i: Request(i, 0.0, "critical", 1000, 500) for i in range(10)}


def _row(minute, *, replicas, ready, nodes):
    return {"t_s": minute * 60.0, "spec_replicas": replicas, "decided": replicas, "model": {"ready": ready},
            "nodes": nodes}


def _run(name, records, timeline, *, pooled=0, node_p90_s=410.0):
    """The figures as `loadtest.e2e.run` adds them, and the scenario's checks on them."""
    config = replace(E2EConfig(factor=FACTOR), pooled_warm_slots=pooled)
    annotate_holds(records, REQUESTS, server=config.server, factor=FACTOR)
    doc = {**holds(records), **wake(records, timeline, after_s=BURST_S),
           "simulated": {"node_timings": {"provisioning_p90_s": node_p90_s}}}
    scenario = SCENARIOS[name]
    context = CheckContext(doc=doc, timeline=timeline, events=[], records=records, logs={}, fleet_events=[],
                           config=config, sim=None, windows=scenario.windows)
    return doc, {c["check"].split(" (")[0].split(":")[0]: c for c in scenario.check(context)}


def _good(cold_start_s=550.0, *, nodes_at_zero=0):
    """Traffic, zero with its node gone by minute 30, a burst whose first two requests are held `cold_start_s`."""
    kept = nodes_at_zero
    timeline = [_row(5, replicas=5, ready=5, nodes=5), _row(20, replicas=0, ready=0, nodes=5),
                _row(30, replicas=0, ready=0, nodes=kept), _row(34.9, replicas=0, ready=0, nodes=kept),
                _row(36, replicas=1, ready=0, nodes=kept), _row(45, replicas=4, ready=4, nodes=4)]
    records = [_record(0, 60.0),
               _record(1, BURST_S, latency_s=cold_start_s + 10.1),  # held, then 10.1 s at the server
               _record(2, BURST_S + 20, latency_s=cold_start_s - 20 + 10.1 + 2.0, queue_s=2.0),
               _record(3, BURST_S + cold_start_s + 30, latency_s=10.2),  # after the wake: not held
               _record(4, BURST_S + 40, status=429, latency_s=0.01, retry_after="5", cls="sheddable")]
    return records, timeline


def test_a_run_that_goes_to_zero_and_back_within_one_cold_start_passes_with_its_figures():
    records, timeline = _good()
    doc, checks = _run("scale-to-zero", records, timeline)
    assert all(c["passed"] for c in checks.values()), checks
    assert [r["hold_s"] for r in records] == pytest.approx([0.0, 550.0, 530.0, 0.0, 0.0], abs=1e-6)
    assert doc["held_requests"] == 2 and doc["dropped_held"] == 0
    assert doc["hold_p50_s"] == 540.0 and doc["hold_p99_s"] == pytest.approx(549.8)
    assert doc["min_replicas_seen"] == 0 and doc["replicas_after_wake"] == 4
    assert doc["cold_start_s"] == 550.0 and doc["first_answer_s"] == pytest.approx(560.1)


def test_an_accidental_5xx_or_a_503_without_retry_after_fails_but_a_deliberate_503_does_not():
    for status, retry_after, passed in ((502, None, False), (503, None, False), (0, None, False), (503, "5", True)):
        records, timeline = _good()
        records.append(_record(5, BURST_S + 10, status=status, latency_s=600.0, retry_after=retry_after))
        doc, checks = _run("scale-to-zero", records, timeline)
        assert checks["every request answered, shed, or dropped with Retry-After"]["passed"] is passed, status
        assert (client_figures(records, ("critical", "sheddable"), 2.0)["lost_requests"] == 0) is passed
        assert doc["dropped_held"] == (1 if passed else 0)


def test_held_requests_count_their_hold_against_the_slo():
    records, _ = _good()
    annotate_holds(records, REQUESTS, server=E2EConfig().server, factor=FACTOR)
    figures = client_figures(records, ("critical", "sheddable"), 2.0)
    assert figures["slo_attainment"]["critical"] == pytest.approx(2 / 4)  # the two held ones miss it


def test_a_node_left_up_through_the_silence_fails_unless_it_is_the_pooled_warm_slot():
    records, timeline = _good(nodes_at_zero=1)
    _, checks = _run("scale-to-zero", records, timeline)
    assert not checks["at zero with its node gone"]["passed"]
    _, checks = _run("scale-to-zero-warm", *_good(150.0, nodes_at_zero=1), pooled=1)
    assert checks["at zero with its node gone"]["passed"]


def test_never_at_zero_or_never_back_fails():
    records, timeline = _good()
    never = [dict(r, spec_replicas=max(1, r["spec_replicas"])) for r in timeline]
    _, checks = _run("scale-to-zero", records, never)
    assert not checks["at zero with its node gone"]["passed"] and not checks["replicas go 0 -> N after the silence"][
        "passed"]
    answered_none = [r if r["sent_s"] < BURST_S else dict(r, status=503, retry_after="5") for r in records]
    _, checks = _run("scale-to-zero", answered_none, timeline)
    assert not checks["first request admitted after one cold start"]["passed"]


@pytest.mark.parametrize("name,pooled,cold_start_s,passed", [
    ("scale-to-zero", 0, 550.0, True),  # node 410 s + start-up up to 150 s + 60 s: at most 620 s
    ("scale-to-zero", 0, 700.0, False),
    ("scale-to-zero", 0, 90.0, False),  # faster than any pod start-up (105 s): not a cold start at all
    ("scale-to-zero-warm", 1, 130.0, True),  # a pod start-up only: at most 210 s
    ("scale-to-zero-warm", 1, 550.0, False),  # waited for a node: the warm slot was not used
])
def test_the_first_admission_must_come_after_about_one_cold_start(name, pooled, cold_start_s, passed):
    records, timeline = _good(cold_start_s, nodes_at_zero=pooled)
    _, checks = _run(name, records, timeline, pooled=pooled)
    assert checks["first request admitted after one cold start"]["passed"] is passed, checks


def test_both_variants_run_in_make_e2e_with_the_same_load_and_only_the_pooled_slot_between_them():
    cold, warm = SCENARIOS["scale-to-zero"], SCENARIOS["scale-to-zero-warm"]
    assert cold.profile == warm.profile and cold.windows == warm.windows
    assert {**cold.config, "pooled_warm_slots": 1} == dict(warm.config)
    assert cold.twin_checked and not warm.twin_checked
    lo, hi = cold.windows["silence"]
    assert cold.profile.multiple(__import__("numpy").array([lo * 60 + 1, hi * 60 - 1])).tolist() == [0.0, 0.0]


def test_a_run_whose_model_does_not_scale_to_zero_holds_no_request():
    """A request 5.2 s slower than its queue and service time, at factor 10: a held request where the model
    scales to zero, a half-second stall of the harness where it does not (doubling run 34: the load
    generator and nginx fell 0.5 s behind under the machine's load, and three critical requests failed the
    SLO on it). Only the scale-to-zero scenarios hold."""
    def stalled():
        return [_record(0, 60.0, latency_s=10.1 + 5.2)]

    held, passed = stalled(), stalled()
    annotate_holds(held, REQUESTS, server=E2EConfig().server, factor=FACTOR)
    annotate_holds(passed, REQUESTS, server=E2EConfig().server, factor=FACTOR, holding=False)
    assert held[0]["hold_s"] == pytest.approx(5.2) and passed[0]["hold_s"] == 0.0
    assert client_figures(held, ("critical",), 2.0)["slo_attainment"]["critical"] == 0.0
    assert client_figures(passed, ("critical",), 2.0)["slo_attainment"]["critical"] == 1.0
    assert holds(passed)["held_requests"] == 0
    holding = {name for name, s in SCENARIOS.items() if replace(E2EConfig(), **s.config).holding}
    assert holding == {"scale-to-zero", "scale-to-zero-warm", "scale-to-zero-keda"}


def test_the_gateway_names_the_requests_it_held_so_a_short_hold_counts_and_a_stall_does_not():
    """With X-Held-Seconds recorded (`gateway_hold_s`), a hold of 3 s at factor 1 (0.3 s of wall clock, under
    the 0.5-s guess older records fall back on) misses the 2-s SLO, and a request the gateway did not hold is
    not held, however slow its exchange (a 5.2-s stall of the harness)."""
    short = _record(0, 60.0, latency_s=10.1 + 3.0)
    stall = _record(1, 60.0, latency_s=10.1 + 5.2)
    guessed = [dict(short), dict(stall)]
    told = [{**short, "gateway_hold_s": 2.9}, {**stall, "gateway_hold_s": None}]
    annotate_holds(guessed, REQUESTS, server=E2EConfig().server, factor=FACTOR)
    annotate_holds(told, REQUESTS, server=E2EConfig().server, factor=FACTOR)
    assert [r["hold_s"] for r in guessed] == [0.0, pytest.approx(5.2)]
    assert [r["hold_s"] for r in told] == [pytest.approx(3.0), 0.0]
    assert client_figures(told, ("critical",), 2.0)["slo_attainment"]["critical"] == 0.5
    assert holds(told)["held_requests"] == 1
    dropped = {**_record(2, 60.0, status=503, latency_s=600.0, retry_after="5"), "gateway_hold_s": None}
    annotate_holds([dropped], REQUESTS, server=E2EConfig().server, factor=FACTOR)
    assert dropped["hold_s"] == 600.0  # the hold that expired (answered by the gateway's @shed, no header)
    # a request the gateway held whose wait the harness reads as none (its answer came quick on the wall
    # clock): held for as long as the gateway says
    quick = {**_record(3, 60.0, latency_s=10.1), "gateway_hold_s": 2.5}
    annotate_holds([quick], REQUESTS, server=E2EConfig().server, factor=FACTOR)
    assert quick["hold_s"] == pytest.approx(2.5) and holds([quick])["held_requests"] == 1


def test_the_load_generator_reads_the_gateways_hold():
    from loadtest.loadgen import _held_seconds

    assert _held_seconds(None, FACTOR) is None
    assert _held_seconds("0.301", FACTOR) == pytest.approx(3.01)
    assert _held_seconds("0.300, 0.001", FACTOR) == pytest.approx(3.01)  # one time per upstream tried
    assert _held_seconds("-", FACTOR) == 0.0  # held, for no time nginx could measure
