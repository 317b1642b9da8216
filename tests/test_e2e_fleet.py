"""The fleet scenario's checks (`python -m loadtest.e2e --scenario fleet`) and the figures they read, on
hand-made runs: runs nothing live (`make e2e` runs the scenario). Each check is shown failing on a run that
breaks what it checks."""

from dataclasses import replace
from pathlib import Path

import pytest

from loadtest.e2e.checks import CheckContext
from loadtest.e2e import fleettwin
from loadtest.e2e.config import E2EConfig
from loadtest.e2e.fleetrun import first_needing_pool, pooled_taken, preemptions
from loadtest import fleetbench
from loadtest.scenarios import SCENARIOS

FLEET = SCENARIOS["fleet"]
TOP, MID, LOW = (m.key for m in FLEET.models)
STARTED = 1_000_000.0


def _row(minute, chat, code, batch):
    return {"t_s": minute * 60.0, "models": {
        key: {"spec_replicas": n, "decided": float(n)} for key, n in ((TOP, chat), (MID, code), (LOW, batch))}}


def _record(minute, *, model=TOP, cls="critical", status=200, queue_s=0.1):
    return {"model": model, "class": cls, "sent_s": minute * 60.0, "status": status,
            "queue_s": queue_s if status == 200 else None}


def _model(tier, *, lost=0, critical=1.0, gap=0.1):
    return {"tier": tier, "lost_requests": lost, "requests": 100, "slo_attainment": {"critical": critical},
            "sim_gap": {"slo_attainment_points": {"critical": gap}}}


def _good():
    """batch borrows (2 -> 7), chat doubles, batch is reclaimed (7 -> 4, two replicas drained); the rows' minutes
    fall in the scenario's windows (borrowed 12-20, reclaimed 26-40, doubled 22-40)."""
    doc = {
        "gpu_limit": 14, "initial_replicas": {TOP: 7, MID: 5, LOW: 2},
        "models": {TOP: _model(0), MID: _model(1), LOW: _model(2, critical=0.98)},
        "drained_s": {TOP: [], MID: [600.0, 610.0], LOW: [1400.0, 1420.0]},
        "pooled_taken": [{"t_s": 500.0, "model": LOW, "placeholder": "p-0"}],
        "first_needing_pool": {"models": [LOW], "t_s": 480.0},
        "fleet": {"gpu_hours": 10.0, "simulated": {"gpu_hours": 10.5}, "sim_gap_gpu_hours_percent": -4.76},
    }
    timeline = [_row(1, 7, 5, 2), _row(12, 4, 3, 6), _row(16, 4, 3, 7), _row(23, 6, 3, 5), _row(30, 6, 3, 4),
                _row(39, 7, 3, 4)]
    records = [_record(m) for m in (1, 10, 19, 25, 35)] + [_record(30, model=LOW, cls="sheddable", status=429)]
    return doc, timeline, records


def _checks(doc, timeline, records):
    context = CheckContext(doc=doc, timeline=timeline, events=[], records=records, logs={}, fleet_events=[],
                           config=replace(E2EConfig(), **FLEET.config), sim=None, windows=FLEET.windows)
    return {c["check"]: c for c in FLEET.check(context)}


NAMES = {
    "lost": "no request lost",
    "borrows": f"the lowest tier ({LOW}) borrows",
    "reclaimed": f"the lowest tier ({LOW}) is reclaimed, drained, nothing lost",
    "top": f"the top tier's ({TOP}) critical class holds",
    "budget": "the fleet's decisions stay within the GPU limit",
    "pooled": "a pooled placeholder goes to the model that needed it first",
    "twin_critical": "twin: every model's critical within 0.5 points",
    "twin_gpu": "twin: fleet GPU-hours within 10 %",
}


def test_a_run_that_borrows_reclaims_and_holds_the_top_tier_passes_every_check():
    assert dict(FLEET.windows) == {"borrowed": (12, 20), "reclaimed": (26, 40), "doubled": (22, 40)}
    checks = _checks(*_good())
    assert set(checks) == set(NAMES.values())
    assert all(c["passed"] for c in checks.values()), checks


def _breaks(name, mutate):
    doc, timeline, records = _good()
    mutate(doc, timeline, records)
    checks = _checks(doc, timeline, records)
    failed = {k for k, v in NAMES.items() if not checks[v]["passed"]}
    assert name in failed, checks[NAMES[name]]
    return failed


def test_a_lost_request_fails():
    def lose(doc, _, __):
        doc["models"][LOW]["lost_requests"] = 1
    assert _breaks("lost", lose) == {"lost", "reclaimed"}


def test_no_borrowing_fails():
    def flat(_, timeline, __):
        for r in timeline:
            r["models"][LOW]["spec_replicas"] = 2
    assert "borrows" in _breaks("borrows", flat)


def test_not_reclaimed_or_not_drained_fails():
    def kept(_, timeline, __):
        for r in timeline[3:]:
            r["models"][LOW]["spec_replicas"] = 7
    _breaks("reclaimed", kept)

    def undrained(doc, _, __):
        doc["drained_s"][LOW] = [700.0, 2500.0]  # before the top tier grew, and after the run's windows
    assert _breaks("reclaimed", undrained) == {"reclaimed"}


def test_the_top_tier_missing_its_slo_while_doubled_fails_even_if_the_whole_run_looks_fine():
    def slow(_, __, records):
        doubled_min = FLEET.windows["doubled"][0]
        records += [_record(doubled_min + 1 + i / 10, queue_s=5.0) for i in range(3)]
    assert _breaks("top", slow) == {"top"}

    def whole(doc, _, __):
        doc["models"][TOP]["slo_attainment"]["critical"] = 0.99
    assert _breaks("top", whole) == {"top"}


def test_decisions_above_the_limit_fail():
    def over(_, timeline, __):
        timeline[4]["models"][LOW]["decided"] = 6.0  # 6 + 3 + 6 = 15 > 14
    assert _breaks("budget", over) == {"budget"}


@pytest.mark.parametrize("preempted,first", [([], {"models": [LOW], "t_s": 480.0}),
                                             ([{"t_s": 500.0, "model": MID, "placeholder": "p-0"}],
                                              {"models": [TOP, LOW], "t_s": 480.0})])
def test_a_placeholder_never_taken_or_taken_by_another_model_fails(preempted, first):
    def other(doc, _, __):
        doc["pooled_taken"], doc["first_needing_pool"] = preempted, first
    assert _breaks("pooled", other) == {"pooled"}


def test_a_twin_off_by_more_than_its_tolerance_fails():
    def off(doc, _, __):
        doc["models"][MID]["sim_gap"]["slo_attainment_points"]["critical"] = -0.6
    assert _breaks("twin_critical", off) == {"twin_critical"}

    def costly(doc, _, __):
        doc["fleet"]["sim_gap_gpu_hours_percent"] = 12.0
    assert _breaks("twin_gpu", costly) == {"twin_gpu"}


def _stamp(scenario_s):
    from datetime import datetime, timezone
    return datetime.fromtimestamp(STARTED + scenario_s / 10.0, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def test_preemptions_name_the_preemptor_model_from_the_event_in_time_order():
    lifetimes = {("model", "uid-b"): {"namespace": "batch"}, ("model", "uid-c"): {"namespace": "chat"}}
    events = [
        {"reason": "Preempted", "involvedObject": {"namespace": "fleet-ops", "name": "p-1"},
         "message": "Preempted by pod uid-c on node n-1", "firstTimestamp": _stamp(900.0)},
        {"reason": "Preempted", "involvedObject": {"namespace": "fleet-ops", "name": "p-0"},
         "related": {"namespace": "batch"}, "eventTime": _stamp(500.0)},
        {"reason": "Preempted", "involvedObject": {"namespace": "chat", "name": "chat-x"}},  # not a placeholder
        {"reason": "Scheduled", "involvedObject": {"namespace": "fleet-ops", "name": "p-2"}},
    ]
    out = preemptions(events, lifetimes, FLEET.models, started=STARTED, factor=10.0)
    assert [(p["model"], p["placeholder"], p["t_s"]) for p in out] == [(LOW, "p-0", 500.0), (TOP, "p-1", 900.0)]


def _full_node(name, *, gpus=1):
    """A node up from the start whose GPUs a replica holds."""
    return {("node", name): {"name": name, "gpus": gpus, "created": STARTED, "gone": None},
            ("model", f"on-{name}"): {"namespace": "code", "node": name, "placed": STARTED, "created": STARTED,
                                      "gone": None, "gpus": gpus}}


def _free_node(name, *, created=0.0, disrupted=None):
    return {("node", name): {"name": name, "gpus": 1, "created": STARTED + created, "gone": None,
                             "disrupted": None if disrupted is None else STARTED + disrupted}}


def _slot(name, *, node, ready=22.0, gone=None):
    """A pooled placeholder on its own node, Ready at `ready`."""
    return {("node", node): {"name": node, "gpus": 1, "created": STARTED, "gone": None},
            ("placeholder", name): {"name": name, "namespace": "fleet-ops", "created": STARTED + 20,
                                    "ready": STARTED + ready, "gone": None if gone is None else STARTED + gone,
                                    "node": node, "placed": STARTED + 21, "gpus": 1}}


def _replica(ns, *, created, node=None, placed=None, gpus=1):
    return {"namespace": ns, "created": STARTED + created, "gone": None, "gpus": gpus, "node": node,
            "placed": None if placed is None else STARTED + placed}


def _first(lifetimes):
    return first_needing_pool(lifetimes, FLEET.models, started=STARTED, factor=10.0)


def test_the_first_model_to_need_a_slot_is_the_earliest_replica_created_while_one_is_ready_with_no_free_room():
    """Two full nodes and a Ready slot on a third: chat's replica at 10 s came before the slot was Ready (it had
    a node of its own, n-2), batch's at 50 s found no free GPU outside the pool, code's at 60 s came after."""
    lifetimes = {**_full_node("n-0"), **_full_node("n-1"), **_slot("p", node="n-3", ready=40),
                 ("node", "n-2"): {"name": "n-2", "gpus": 1, "created": STARTED, "gone": None},
                 ("model", "a"): _replica("chat", created=10, node="n-2", placed=11),
                 ("model", "b"): _replica("batch", created=50),
                 ("model", "c"): _replica("code", created=60)}
    assert _first(lifetimes) == {"models": [LOW], "t_s": 500.0}
    del lifetimes[("placeholder", "p")]
    assert _first(lifetimes) == {}  # no slot: nobody needed the pool


def test_a_replica_that_lands_on_a_free_node_did_not_need_the_pool():
    """Run 19: chat scaled first once the pool was Ready, onto the node its own drain had freed; its replica
    took no placeholder. The first model to NEED a slot is the next one created with no free room left."""
    lifetimes = {**_full_node("n-0"), **_full_node("n-1"), **_free_node("free"), **_slot("p", node="pooled"),
                 ("model", "chat-1"): _replica("chat", created=55, node="free", placed=56),
                 ("model", "batch-1"): _replica("batch", created=65, node="pooled", placed=70)}
    assert _first(lifetimes) == {"models": [LOW], "t_s": 650.0}


def test_a_replica_placed_in_the_second_it_was_created_does_not_hold_the_room_it_is_tested_for():
    """Run 25: batch's replica was created and placed on a free node in the same second (placed = created, both
    whole seconds); counting it as holding that node left no free room for itself, so it "needed" the pool,
    and chat's later take of a placeholder failed the check."""
    lifetimes = {**_full_node("n-0"), **_full_node("n-1"), **_free_node("free"), **_slot("p", node="pooled"),
                 ("model", "batch-1"): _replica("batch", created=65, node="free", placed=65),
                 ("model", "chat-1"): _replica("chat", created=75, node="pooled", placed=75)}
    assert _first(lifetimes) == {"models": [TOP], "t_s": 750.0}


def test_replicas_created_in_one_second_wait_for_each_other():
    """A creationTimestamp is a whole second (10 scenario seconds here) and a fleet tick creates several
    replicas at once: two of chat's in one second with one free node left, the second needed the pool."""
    lifetimes = {**_full_node("n-0"), **_full_node("n-1"), **_free_node("free"), **_slot("p", node="pooled"),
                 ("model", "chat-1"): _replica("chat", created=55), ("model", "chat-2"): _replica("chat", created=55),
                 ("model", "batch-1"): _replica("batch", created=65, node="pooled", placed=70)}
    assert _first(lifetimes) == {"models": [TOP], "t_s": 550.0}


def test_models_that_scaled_in_the_same_second_all_needed_the_pool_first():
    """chat (tier 0) and batch (tier 2) in one tick, no free room: either may have taken the slot first."""
    lifetimes = {**_full_node("n-0"), **_full_node("n-1"), **_slot("p", node="pooled"),
                 ("model", "batch-1"): _replica("batch", created=70), ("model", "chat-1"): _replica("chat", created=70)}
    first = _first(lifetimes)
    assert first == {"models": [TOP, LOW], "t_s": 700.0}

    def taken_by(model):
        def mutate(doc, _, __):
            doc["first_needing_pool"] = first
            doc["pooled_taken"] = [{"t_s": 705.0, "model": model, "placeholder": "p-0"}]
        return mutate
    assert _breaks("pooled", taken_by(MID)) == {"pooled"}
    doc, timeline, records = _good()
    taken_by(LOW)(doc, timeline, records)
    assert _checks(doc, timeline, records)[NAMES["pooled"]]["passed"]


def test_a_slot_withdrawn_before_the_replica_came_was_not_needed():
    """The only placeholder went at 30 s (the pool shrank to nothing) and its node at 40 s: a replica at 60 s
    with no free room waited for a node; no Ready slot was there to need."""
    lifetimes = {**_full_node("n-0"), **_full_node("n-1"), **_slot("p", node="n-2", gone=30),
                 ("model", "chat-1"): _replica("chat", created=60)}
    lifetimes[("node", "n-2")]["gone"] = STARTED + 40
    assert _first(lifetimes) == {}


def test_a_node_being_removed_is_no_free_room():
    """Karpenter taints a node it disrupts: the scheduler places nothing there, so a replica created then
    found no free room outside the pool although the Node object was still up."""
    lifetimes = {**_full_node("n-0"), **_free_node("leaving", disrupted=50), **_slot("p", node="pooled"),
                 ("model", "chat-1"): _replica("chat", created=55)}
    assert _first(lifetimes) == {"models": [TOP], "t_s": 550.0}
    lifetimes[("node", "leaving")]["disrupted"] = None
    assert _first(lifetimes) == {}


def test_the_smoke_run_fails_when_a_model_is_never_served():
    smoke = SCENARIOS["fleet-smoke"]
    a, b = (m.key for m in smoke.models)
    doc = {"gpu_limit": 16, "models": {a: {"requests": 10, "lost_requests": 0}, b: {"requests": 5, "lost_requests": 0}}}
    timeline = [{"t_s": 0.0, "models": {a: {"decided": 7.0}, b: {"decided": 7.0}}}]

    def checks(doc):
        context = CheckContext(doc=doc, timeline=timeline, events=[], records=[], logs={}, fleet_events=[],
                               config=E2EConfig(), sim=None, windows=smoke.windows)
        return {c["check"]: c["passed"] for c in smoke.check(context)}
    assert all(checks(doc).values())
    doc["models"][b]["lost_requests"] = 5
    assert checks(doc) == {"every model is served through the gateway": False, "no request lost": False,
                           "the fleet's decisions stay within the GPU limit": True}


def test_a_placeholder_released_to_a_model_is_taken_by_the_first_replica_placed_on_its_node():
    """Three 1-GPU nodes, each with a placeholder and nothing free elsewhere: every replica placed on a Ready
    placeholder's node as it went needed it."""
    lifetimes = {
        **{("node", n): {"name": n, "gpus": 1, "created": STARTED, "gone": None} for n in ("n-1", "n-2", "n-3")},
        ("placeholder", "p0"): {"name": "p-0", "namespace": "fleet-ops", "node": "n-1", "placed": STARTED + 9,
                                "ready": STARTED + 10, "gone": STARTED + 50, "gpus": 1},
        ("placeholder", "p1"): {"name": "p-1", "namespace": "fleet-ops", "node": "n-2", "placed": STARTED + 9,
                                "ready": STARTED + 10, "gone": STARTED + 60, "gpus": 1},
        ("placeholder", "p2"): {"name": "p-2", "namespace": "fleet-ops", "node": "n-3", "placed": STARTED + 9,
                                "ready": None, "gone": STARTED + 60, "gpus": 1},  # never Ready: no warm slot to take
        # on n-1 before the slot, gone before the placeholder came: not the slot's taker
        ("model", "old"): {**_replica("code", created=0, node="n-1", placed=1), "gone": STARTED + 5},
        ("model", "b"): _replica("batch", created=50, node="n-1", placed=51),
        # preempted it
        ("model", "c"): _replica("chat", created=58, node="n-2", placed=59),
        ("model", "x"): _replica("chat", created=60, node="n-3", placed=61),
    }
    events = [{"reason": "Preempted", "involvedObject": {"namespace": "fleet-ops", "name": "p-1"},
               "related": {"namespace": "chat"}, "eventTime": _stamp(580.0)}]
    taken = pooled_taken(events, lifetimes, FLEET.models, started=STARTED, factor=10.0)
    assert [(p["model"], p["placeholder"], p["t_s"]) for p in taken] == [(LOW, "p-0", 510.0), (TOP, "p-1", 580.0)]


def test_a_placeholder_withdrawn_and_refilled_on_its_node_was_not_taken_by_the_model_that_came_later():
    """Run 19: the pool shrank and a placeholder went; a refill placeholder took its node, and a model's
    replica came onto that node only when it preempted the refill. Only the refill was taken."""
    lifetimes = {
        ("placeholder", "p0"): {"name": "p-0", "namespace": "fleet-ops", "node": "n-1", "placed": STARTED + 9,
                                "ready": STARTED + 10, "gone": STARTED + 55},
        ("placeholder", "p1"): {"name": "p-1", "namespace": "fleet-ops", "node": "n-1", "placed": STARTED + 63,
                                "ready": STARTED + 64, "gone": STARTED + 65},
        ("model", "b"): _replica("batch", created=64, node="n-1", placed=65),
    }
    taken = pooled_taken([], lifetimes, FLEET.models, started=STARTED, factor=10.0)
    assert [(p["model"], p["placeholder"], p["t_s"]) for p in taken] == [(LOW, "p-1", 650.0)]


def test_three_tiers_start_within_the_limit_where_the_twin_starts_them():
    config = replace(E2EConfig(), **FLEET.config)
    assert sorted(m.tier for m in FLEET.models) == [0, 1, 2]
    workloads = {m.key: fleettwin.requests_of(m, config, seed=i)[0] for i, m in enumerate(FLEET.models)}
    starts = fleettwin.starts(FLEET.models, workloads, config)
    assert set(starts) == {m.key for m in FLEET.models} and all(n >= 1 for n in starts.values())
    assert sum(starts.values()) <= config.gpu_limit


def test_the_twin_starts_where_the_live_run_started_whatever_node_wait_it_runs_on(monkeypatch):
    """On a longer node wait the simulator would size a longer first cold start and start elsewhere."""
    started = {}
    reset = fleetbench._reset
    monkeypatch.setattr(fleetbench, "_reset", lambda models, policy, starts: (started.update(starts),
                                                                             reset(models, policy, starts)))
    config = replace(E2EConfig(), **FLEET.config)
    workloads = {m.key: fleettwin.requests_of(m, config, seed=i)[0] for i, m in enumerate(FLEET.models)}
    live = fleettwin.starts(FLEET.models, workloads, config)
    slow = replace(config, node_provisioning_s=410.0)
    assert fleettwin.starts(FLEET.models, workloads, slow) != live  # else this test shows nothing
    members = fleettwin._members(FLEET.models, workloads, slow.sim_config(), slow.spec())
    fleetbench.simulate("fleet", members, limit=config.gpu_limit, n=1, starts=live)
    assert started == live


def test_the_summary_prints_each_model_with_its_twin_and_the_fleets_totals():
    from loadtest.e2e.__main__ import _summary, table
    model = {"tier": 0, "slo_attainment": {"critical": 0.995}, "shed_fraction": {"critical": 0.0, "sheddable": 0.25},
             "gpu_hours": 3.9, "replicas_seen": {"min": 4, "max": 8},
             "simulated": {"slo_attainment": {"critical": 1.0}}}
    doc = {"scenario": "fleet", "factor": 10.0, "gpu_limit": 14, "models": {TOP: model},
           "fleet": {"requests": 9603, "lost_requests": 0, "gpu_hours": 9.333, "max_nodes": 14,
                     "simulated": {"gpu_hours": 9.687}},
           "checks": [{"check": "no request lost", "passed": True, "detail": "none"}]}
    text = _summary(doc)
    assert "9603 requests, 0 lost, 9.33 GPU-h (simulated 9.69), at most 14 nodes under a 14-GPU limit" in text
    assert f"{TOP} (tier 0): within SLO critical 99.500% (100.000%); shed sheddable 25.00%" in text
    assert "replicas 4-8" in text and "[ok] no request lost" in text
    assert "fleet" not in table([doc])  # its figures are per model: the single-model table leaves it out


def test_the_fleet_scenario_runs_priority_servers_and_its_twin_serves_the_same_order():
    """Every model's servers run vLLM's priority scheduling and the load generator sends the class's
    priority (a fcfs server would refuse it); the twin's simulated servers serve critical first too."""
    from loadtest import fleet, loadgen
    from loadtest.e2e.fleetrun import loadgen_command
    from loadtest.e2e.fleetstack import model_servers_command
    config = replace(E2EConfig(), **FLEET.config)
    assert config.sim_config().server_priority
    for m in FLEET.models:
        servers = model_servers_command(config, m, Path("w"), kubeconfig="k", nginx_pid=Path("n.pid"))
        sends = loadgen_command(config, m, Path("o"), url="http://gw", start_at=1.0)
        assert servers[1:3] == ["-m", "loadtest.fleet"] and sends[1:3] == ["-m", "loadtest.loadgen"]
        assert fleet.parse_args(servers[3:]).scheduling_policy == "priority"
        args = loadgen.parse_args(sends[3:])
        assert args.priority_in_body and args.model == m.key
    plain = model_servers_command(E2EConfig(), m, Path("w"), kubeconfig="k", nginx_pid=Path("n.pid"))
    assert fleet.parse_args(plain[3:]).scheduling_policy == "fcfs"
    sends = loadgen_command(E2EConfig(), m, Path("o"), url="u", start_at=1.0)
    assert not loadgen.parse_args(sends[3:]).priority_in_body


def test_a_placeholder_withdrawn_whose_node_sat_free_was_not_taken_by_the_replica_that_came_later():
    """Run 20: the pool shrank and a placeholder went at 597 s; its node sat free, and a replica created at
    649 s landed there. That replica found free room: no slot was handed to it."""
    lifetimes = {
        ("placeholder", "p0"): {"name": "p-0", "namespace": "fleet-ops", "node": "n-1", "placed": STARTED + 49,
                                "ready": STARTED + 51, "gone": STARTED + 59.7},
        ("model", "b"): _replica("batch", created=64, node="n-1", placed=64.9),
    }
    assert pooled_taken([], lifetimes, FLEET.models, started=STARTED, factor=10.0) == []
    lifetimes[("model", "b")]["created"] = STARTED + 60  # created as the slot went (the same tick)
    assert [p["placeholder"] for p in pooled_taken([], lifetimes, FLEET.models, started=STARTED, factor=10.0)
            ] == ["p-0"]


def test_a_placeholder_scaled_down_while_free_room_was_left_elsewhere_was_not_taken():
    """The pool shrank (its need dropped) in the second chat scaled; a free node was left outside the pool, and
    the scheduler happened to place chat's replica on the placeholder's node: the replica did not need it.
    With no free node elsewhere, the same handover is a take."""
    lifetimes = {**_full_node("n-0"), **_free_node("free"), **_slot("p-0", node="pooled", gone=70),
                 ("model", "chat-1"): _replica("chat", created=70, node="pooled", placed=70.5)}
    assert pooled_taken([], lifetimes, FLEET.models, started=STARTED, factor=10.0) == []
    del lifetimes[("node", "free")]
    assert [(p["model"], p["placeholder"]) for p in pooled_taken([], lifetimes, FLEET.models, started=STARTED,
                                                                  factor=10.0)] == [(TOP, "p-0")]


class _ControlPlane:
    """The API paths the fleet sampler reads, answered from dicts."""

    def __init__(self, pods, nodes):
        self.pods, self.nodes = pods, nodes

    def request(self, method, path):
        if path.startswith("/api/v1/nodes"):
            return 200, {"items": self.nodes}
        if path.startswith("/api/v1/namespaces/") and path.endswith("/pods"):
            ns = path.split("/")[4]
            return 200, {"items": [p for p in self.pods if p["metadata"]["namespace"] == ns]}
        return 404, {}


def test_the_sampler_reads_each_pods_gpus_when_a_node_started_leaving_and_when_a_pod_vanished():
    from loadtest.e2e.fleetstack import FleetStack

    def pod(name, ns, gpus, app):
        return {"metadata": {"name": name, "namespace": ns, "uid": name, "labels": {"app": app},
                             "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": str(gpus), "cpu": "4"}}}]}}

    def node(name, taints=()):
        return {"metadata": {"name": name, "uid": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"taints": list(taints)}, "status": {"capacity": {"nvidia.com/gpu": "2"}}}

    chat = FLEET.models[0]
    cp = _ControlPlane([pod("c", chat.namespace, 2, chat.name), pod("w", "fleet-ops", 1, "warm")],
                       [node("n-0"), node("n-1")])
    st = FleetStack(config=replace(E2EConfig(), **FLEET.config), models=FLEET.models, cp=cp, karpenter=None,
                    controller=None, gateway_url="", work=None)
    seen = set()
    st._pods(1.0, seen)
    st._nodes(1.0, seen)
    cp.nodes[1]["spec"]["taints"] = [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]
    st._nodes(2.0, seen)
    st._nodes(3.0, seen)
    assert st.lifetimes[("model", "c")]["gpus"] == 2 and st.lifetimes[("placeholder", "w")]["gpus"] == 1
    assert st.lifetimes[("node", "n-0")]["disrupted"] is None and st.lifetimes[("node", "n-1")]["disrupted"] == 2.0
    cp.pods[0]["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"  # chat's replica drains...
    seen = set()
    st._pods(4.0, seen)
    st._unseen(4.0, seen)
    cp.pods = cp.pods[1:]  # ...and is gone from the API server
    for now in (5.0, 6.0):
        seen = set()
        st._pods(now, seen)
        st._unseen(now, seen)
    assert (st.lifetimes[("model", "c")]["gone"], st.lifetimes[("model", "c")]["vanished"]) == (4.0, 5.0)


def test_a_runs_own_output_carries_what_traces_its_pooled_attribution(tmp_path):
    """result.json names scenario second 0 on the wall clock, and the Events are written beside the lifetimes:
    the trace recomputes the run's attribution from the folder alone."""
    from loadtest.e2e.fleetrun import write_outputs
    from loadtest.e2e.fleettrace import trace
    lifetimes = {**_full_node("n-0"), **_slot("p-0", node="pooled", gone=70.2),
                 ("model", "chat-1"): _replica("chat", created=70, node="pooled", placed=70.5)}
    events = [{"reason": "Preempted", "involvedObject": {"namespace": "fleet-ops", "name": "p-9"},
               "related": {"namespace": "batch"}, "eventTime": _stamp(900.0)}]
    doc = {"scenario": "fleet", "factor": 10.0, "started_unix_s": STARTED,
           "pooled_taken": pooled_taken(events, lifetimes, FLEET.models, started=STARTED, factor=10.0),
           "first_needing_pool": _first(lifetimes)}
    write_outputs(tmp_path, doc=doc, timeline=[], lifetimes=lifetimes, events=events)
    traced = trace(tmp_path)["pooled"]
    assert [p["placeholder"] for p in traced["pooled_taken"]] == ["p-0", "p-9"] == [
        p["placeholder"] for p in doc["pooled_taken"]]
    assert traced["first_needing_pool"] == doc["first_needing_pool"] == {"models": [TOP], "t_s": 700.0}
    assert traced["passed"]
    assert traced["placeholders"] == [{"name": "p-0", "ready_s": 220.0, "gone_s": 702.0, "next_pod": {
        "kind": "model", "namespace": "chat", "created_s": 700.0, "placed_s": 705.0}}]


def test_an_older_run_is_placed_by_the_samples_that_stamped_its_pods_ready():
    from loadtest.e2e.fleettrace import started_from_samples
    started = STARTED + 0.123456
    timeline = [{"t_s": (started + dt - started) * 10.0} for dt in (0.5, 1.13, 1.71, 2.29)]
    lifetimes = {("model", "a"): {"ready": started + 1.13}, ("model", "b"): {"ready": started + 2.29},
                 ("placeholder", "c"): {"ready": None}, ("node", "n"): {"ready": started + 0.5}}
    assert started_from_samples(lifetimes, timeline, factor=10.0) == round(started, 6)
    assert started_from_samples({("model", "a"): {"ready": started + 1.13}}, timeline, factor=10.0) is None


def test_the_trace_finds_each_late_critical_request_with_what_was_in_flight_and_queued_when_it_came():
    from loadtest.e2e.fleettrace import late_requests

    def rec(sent, cls="standard", queue=0.0, latency=30.0, status=200):
        return {"class": cls, "sent_s": sent, "queue_s": queue, "latency_s": latency, "status": status}
    timeline = [{"t_s": 0.0, "models": {TOP: {"pods": {"ready": 1}}}},
                {"t_s": 50.0, "models": {TOP: {"pods": {"ready": 2}}}}]
    records = [rec(1.0), rec(2.0), rec(9.0, queue=3.0), rec(9.5, cls="sheddable", queue=4.0),
               rec(10.0, cls="critical", queue=2.5), rec(11.0, cls="critical", queue=1.0),  # within the SLO
               rec(12.0, status=429, queue=None, latency=0.01), rec(60.0, cls="critical", queue=2.1, latency=5.0)]
    late = late_requests(records, timeline, key=TOP, slo_s=2.0, concurrency=2)
    assert late == [
        {"sent_min": round(10 / 60, 3), "wait_s": 2.5, "in_flight": 5, "ready_replicas": 1, "slots": 2,
         "queued_ahead": {"sheddable": 1, "standard": 1}},
        {"sent_min": 1.0, "wait_s": 2.1, "in_flight": 1, "ready_replicas": 2, "slots": 4, "queued_ahead": {}}]


def test_the_fleet_benchmark_builds_its_servers_from_the_whole_config_as_the_single_model_one_does():
    """The fleet's simulated servers honour the config's hold, service-by-completion and Ready-seen tick
    (they had drifted from the single-model simulator's: built without them)."""
    config = replace(E2EConfig(), **FLEET.config)
    workloads = {m.key: fleettwin.requests_of(m, config, seed=i)[0] for i, m in enumerate(FLEET.models)}
    # the hold is modelled with one shared queue only (the scenario's own twin serves a queue per replica)
    sim_config = replace(config.sim_config(), dispatch="shared", max_hold_s=90.0, service_by_completion=True,
                         ready_seen_every_s=15.0)
    members = fleettwin._members(FLEET.models, workloads, sim_config, config.spec())
    fleetbench._reset(members, "fleet", {m.key: 1 for m in FLEET.models})
    assert {(m.sim.max_hold_s, m.sim.service_by_completion, m.sim.ready_seen_every_s) for m in members} == {
        (90.0, True, 15.0)}


def test_server_priority_on_a_rate_trace_is_refused_by_both_benchmarks():
    import numpy as np
    from autoscaler.sim.run import SimConfig
    from autoscaler.sim.workload import RateWorkload
    workload = RateWorkload(name="r", scale=1.0, window_s=600.0, rate_per_s=np.array([1.0, 1.0]),
                            client_rate_per_s=np.ones((1, 2)), client_cv2=np.full((1, 2), 1e-6),
                            service_s=np.full(2, 1.0), output_tokens=np.zeros(2), priority_mix=(1.0, 0.0, 0.0),
                            span_s=1200.0)
    member = fleetbench.Model("r", 0, 1.0, workload, SimConfig(server_priority=True), np.ones(2, dtype=int),
                              E2EConfig().spec())
    with pytest.raises(ValueError, match="server priority is modelled only for request traces"):
        fleetbench._reset([member], "fleet", {"r": 1})
    member.config = SimConfig(max_hold_s=300.0)
    fleetbench._reset([member], "fleet", {"r": 1})
    assert member.sim.holds is not None  # a rate trace's hold too


def test_a_draining_replica_holds_its_gpu_until_it_vanishes():
    """chat's old replica on the only free node was being deleted from 54 s (its drain, a grace period) and
    vanished at 58 s: chat's new replica at 55 s found no free GPU there and needed the pool."""
    lifetimes = {**_full_node("n-0"), **_free_node("free"), **_slot("p", node="pooled"),
                 ("model", "old"): {**_replica("chat", created=0, node="free", placed=0), "gone": STARTED + 54,
                                    "vanished": STARTED + 58},
                 ("model", "chat-1"): _replica("chat", created=55),
                 ("model", "batch-1"): _replica("batch", created=65, node="pooled", placed=70)}
    assert _first(lifetimes) == {"models": [TOP], "t_s": 550.0}
    lifetimes[("model", "old")]["vanished"] = STARTED + 54.5
    assert _first(lifetimes) == {"models": [LOW], "t_s": 650.0}


def test_a_free_gpu_beside_a_placeholder_on_its_node_is_free_room():
    """Outside the pool means outside the placeholders' GPUs, not their nodes: on a 2-GPU node with one
    placeholder, chat's replica fits in the other GPU and needs no slot; with both GPUs held it does."""
    lifetimes = {**_full_node("n-0"), **_slot("p", node="n-2"),
                 ("model", "chat-1"): _replica("chat", created=55)}
    lifetimes[("node", "n-2")]["gpus"] = 2
    assert _first(lifetimes) == {}
    lifetimes[("model", "code-1")] = _replica("code", created=30, node="n-2", placed=31)
    assert _first(lifetimes) == {"models": [TOP], "t_s": 550.0}


def test_fleettrace_counts_the_429s_by_the_endpoints_reason():
    from loadtest.e2e.fleettrace import shed_reasons

    kept = "keeping {} of {} slots for the top class: {} busy, standard"
    records = [
        {"class": "standard", "status": 429, "shed_reason": kept.format(2, 8, 7)},
        {"class": "standard", "status": 429, "shed_reason": kept.format(1, 24, 23)},
        {"class": "sheddable", "status": 429, "shed_reason": "shedding 25% of sheddable"},
        {"class": "sheddable", "status": 429},  # a record from before the reason was kept
        {"class": "standard", "status": 200, "shed_reason": None},
    ]
    assert shed_reasons(records) == {
        "sheddable": {"shedding N of sheddable": 1, "unknown": 1},
        "standard": {"keeping N of N slots for the top class": 2},
    }
