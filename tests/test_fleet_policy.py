"""The fleet decision (policies/fleet.py): properties over random fleets (hypothesis), timelines for its
hysteresis, examples for its reasons and its pooled warm capacity."""

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import Decision
from policies.fleet import (
    Budgets, FleetSpec, FleetState, ModelDemand, allocate, class_demand, early_warm_slots, level_order,
)

SPEC = FleetSpec(warm_after="tier")  # the early-warm-slot rule on, so every property covers it
CLASSES = SPEC.classes


def demand(**per_class: int) -> dict[str, int]:
    return {c: per_class.get(c, 0) for c in CLASSES}


@st.composite
def fleets(draw, *, shapes=(1, 2, 4, 8), max_models=5):
    n = draw(st.integers(1, max_models))
    namespaces = ("team-a", "team-b", "")
    models = []
    for i in range(n):
        models.append(ModelDemand(
            name=f"m{i}",
            demand_replicas={c: draw(st.integers(0, 12)) for c in CLASSES},
            gpus_per_replica=draw(st.sampled_from(shapes)),
            tier=draw(st.integers(0, 2)),
            weight=draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])),
            namespace=draw(st.sampled_from(namespaces)),
            warm_slots=draw(st.integers(0, 6)),
            nominal_gpus=draw(st.sampled_from([0, 0, 4, 16])),
            borrowing_limit_gpus=draw(st.sampled_from([None, None, 0, 8])),
            # a drain ranks a higher tier's early warm slots before this model's replicas (early_warm_slots)
            lead_time_s=draw(st.sampled_from([None, 60.0, 300.0])),
            drain_s=draw(st.sampled_from([0.0, 0.0, 30.0])),
        ))
    return models


@st.composite
def budgets(draw):
    fleet = draw(st.one_of(st.none(), st.integers(0, 200)))
    caps = draw(st.dictionaries(st.sampled_from(["team-a", "team-b"]), st.integers(0, 80), max_size=2))
    return Budgets(fleet_gpus=fleet, namespace_gpus=caps)


def gpus(models, decision, *, namespace=None) -> int:
    return sum(decision.models[m.name].replicas * m.gpus_per_replica for m in models
               if namespace is None or m.namespace == namespace)


def level_gpus(models, decision, tier, cls) -> dict[str, int]:
    return {m.name: decision.models[m.name].replicas_by_class.get(cls, 0) * m.gpus_per_replica
            for m in models if m.tier == tier}


@settings(max_examples=300, deadline=None)
@given(fleets(), budgets())
def test_never_above_any_budget(models, caps):
    decision, _ = allocate(SPEC, models, caps, FleetState(), 0.0)
    if caps.fleet_gpus is not None:
        assert decision.gpus_used <= caps.fleet_gpus
        assert gpus(models, decision) + sum(g * s for g, s in decision.warm_by_shape.items()) <= caps.fleet_gpus
    for ns, cap in caps.namespace_gpus.items():
        assert gpus(models, decision, namespace=ns) <= cap
    for m in models:
        a = decision.models[m.name]
        assert a.replicas <= m.replicas_wanted
        assert a.replicas * m.gpus_per_replica <= m.max_gpus
        assert all(a.replicas_by_class.get(c, 0) <= m.demand_replicas[c] for c in CLASSES)


@settings(max_examples=200, deadline=None)
@given(fleets(), budgets(), st.integers(1, 9))
def test_a_level_never_takes_gpus_a_higher_level_needs(models, caps, cut):
    """Removing the demand of every level from `cut` on changes nothing above it. (Nominal quotas are
    left out: they form a level of their own, served before every tier.)"""
    models = [replace(m, nominal_gpus=0) for m in models]
    levels = level_order(SPEC, models)
    cut = min(cut, len(levels))
    lower = set(levels[cut:])
    trimmed = [replace(m, demand_replicas={c: (0 if (m.tier, c) in lower else n)
                                           for c, n in m.demand_replicas.items()}) for m in models]
    full, _ = allocate(SPEC, models, caps, FleetState(), 0.0)
    alone, _ = allocate(SPEC, trimmed, caps, FleetState(), 0.0)
    for tier, cls in levels[:cut]:
        assert level_gpus(models, full, tier, cls) == level_gpus(trimmed, alone, tier, cls)


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 5), st.integers(1, 30), st.sampled_from([1, 2, 4]), st.integers(0, 150),
       st.sampled_from(CLASSES), st.integers(0, 2), st.lists(st.integers(0, 30), min_size=5, max_size=5))
def test_equal_weights_at_equal_demand_get_equal_shares(n, want, shape, cap, cls, tier, held):
    """Whatever each held last tick (the hysteresis credit does not stretch the one-replica band)."""
    models = [ModelDemand(f"m{i}", demand(**{cls: want}), gpus_per_replica=shape, tier=tier) for i in range(n)]
    previous = FleetState(replicas={m.name: h for m, h in zip(models, held)})
    decision, _ = allocate(SPEC, models, Budgets(fleet_gpus=cap), previous, 0.0)
    got = [decision.models[m.name].replicas for m in models]
    assert max(got) - min(got) <= 1


@settings(max_examples=200, deadline=None)
@given(fleets(shapes=(2,)), st.integers(0, 150), st.integers(1, 40),
       st.dictionaries(st.sampled_from(["team-a", "team-b"]), st.integers(0, 80), max_size=2))
def test_more_gpus_never_lower_anyones_allocation(models, cap, more, ns_caps):
    """With one replica shape (module docstring: with mixed shapes whole replicas and work conservation
    exclude monotonicity), every nominal claim due. A claim still waiting for its reclaim horizon is served
    from the GPUs nobody held, which a larger cap enlarges: with more GPUs it takes its quota from that room at
    once, and another model may get less than while the claim waited, never less than the immediate
    allocation gives it (that waiting only postpones: test_a_reclaim_is_only_postponed_and_never_above_a_budget)
    nor less than it held and kept (test_a_waiting_claim_never_takes_with_more_gpus_what_a_model_held_and_kept)."""
    previous = FleetState(replicas={m.name: m.replicas_wanted // 2 for m in models},
                          claim_since={m.name: -math.inf for m in models})
    small, _ = allocate(SPEC, models, Budgets(fleet_gpus=cap, namespace_gpus=ns_caps), previous, 0.0)
    large, _ = allocate(SPEC, models, Budgets(fleet_gpus=cap + more, namespace_gpus=ns_caps), previous, 0.0)
    for m in models:
        assert large.models[m.name].replicas >= small.models[m.name].replicas


@settings(max_examples=300, deadline=None)
@given(fleets(), budgets(), st.randoms(use_true_random=False), st.booleans())
def test_the_order_models_are_listed_in_changes_nothing(models, caps, rnd, due):
    """Nominal quotas that together exceed a cap included: they are served by level and weight, not in list
    order (a tier-2 model listed first kept its quota while a tier-0 model got none)."""
    state = FleetState(replicas={m.name: m.replicas_wanted // 2 for m in models},
                       claim_since={m.name: -math.inf for m in models} if due else {})
    shuffled = list(models)
    rnd.shuffle(shuffled)
    a, _ = allocate(SPEC, models, caps, state, 0.0)
    b, _ = allocate(SPEC, shuffled, caps, state, 0.0)
    assert a.warm_by_shape == b.warm_by_shape
    for m in models:
        assert (a.models[m.name].replicas, a.models[m.name].replicas_by_class, a.models[m.name].warm_slots) == \
            (b.models[m.name].replicas, b.models[m.name].replicas_by_class, b.models[m.name].warm_slots)


@settings(max_examples=500, deadline=None)
@given(fleets(shapes=(2,)), st.integers(0, 150), st.integers(1, 40),
       st.dictionaries(st.sampled_from(["team-a", "team-b", ""]), st.integers(0, 80), max_size=3))
def test_a_waiting_claim_never_takes_with_more_gpus_what_a_model_held_and_kept(models, cap, more, ns_caps):
    """Claims not yet due (one replica shape): a larger cap may give a waiting claim the room nobody held, in
    the fleet and in its namespace, never what another model held last tick and kept at the smaller cap."""
    previous = FleetState(replicas={m.name: m.replicas_wanted // 2 for m in models})
    small, _ = allocate(SPEC, models, Budgets(fleet_gpus=cap, namespace_gpus=ns_caps), previous, 0.0)
    large, _ = allocate(SPEC, models, Budgets(fleet_gpus=cap + more, namespace_gpus=ns_caps), previous, 0.0)
    for m in models:
        assert large.models[m.name].replicas >= min(previous.replicas[m.name], small.models[m.name].replicas)


def test_nominal_quotas_beyond_a_cap_go_by_tier_then_fair_share():
    """Three 2-GPU models with 2-GPU quotas under a 4-GPU namespace cap: the two tier-0 models get theirs,
    the tier-2 model none, whichever is listed first."""
    def model(name: str, tier: int) -> ModelDemand:
        return ModelDemand(name, demand(critical=2), gpus_per_replica=2, tier=tier, namespace="team-a",
                           nominal_gpus=2)
    for order in (["batch", "chat", "code"], ["code", "chat", "batch"]):
        tiers = {"batch": 2, "chat": 0, "code": 0}
        decision, _ = allocate(SPEC, [model(n, tiers[n]) for n in order], Budgets(namespace_gpus={"team-a": 4}),
                               FleetState(), 0.0)
        assert {n: a.replicas for n, a in decision.models.items()} == {"batch": 0, "chat": 1, "code": 1}


@settings(max_examples=300, deadline=None)
@given(fleets(), budgets())
def test_work_conserving(models, caps):
    """No model with unmet demand has a replica that fits what the fleet (after replicas and the warm slots
    ranked before them), its namespace and its borrowing limit leave."""
    decision, _ = allocate(SPEC, models, caps, FleetState(), 0.0)
    fleet_left = math.inf if caps.fleet_gpus is None else caps.fleet_gpus - decision.gpus_used
    for m in models:
        if decision.models[m.name].replicas < m.replicas_wanted:
            ns_left = caps.namespace_gpus.get(m.namespace, math.inf) - gpus(models, decision, namespace=m.namespace)
            own_left = m.max_gpus - decision.models[m.name].replicas * m.gpus_per_replica
            assert m.gpus_per_replica > min(fleet_left, ns_left, own_left)


def test_mixed_shapes_trade_monotonicity_for_work_conservation():
    """5 GPUs: after three 1-GPU replicas the 4-GPU one does not fit, and the 1-GPU model takes the rest;
    7 GPUs let the 4-GPU replica in at its turn and the 1-GPU model gets less: the documented trade-off."""
    models = [ModelDemand("a", demand(critical=1), gpus_per_replica=4), ModelDemand("b", demand(critical=8))]
    five, _ = allocate(SPEC, models, Budgets(fleet_gpus=5), FleetState(), 0.0)
    seven, _ = allocate(SPEC, models, Budgets(fleet_gpus=7), FleetState(), 0.0)
    assert (five.models["a"].replicas, five.models["b"].replicas) == (0, 5)
    assert (seven.models["a"].replicas, seven.models["b"].replicas) == (1, 3)


def test_weighted_share():
    """Weight 3 against 1 at the same level: 16 GPUs split 12 / 4."""
    models = [ModelDemand("heavy", demand(standard=20), weight=3.0), ModelDemand("light", demand(standard=20))]
    decision, _ = allocate(SPEC, models, Budgets(fleet_gpus=16), FleetState(), 0.0)
    assert (decision.models["heavy"].replicas, decision.models["light"].replicas) == (12, 4)


def test_levels_in_order_and_configurable():
    models = [ModelDemand("top", demand(critical=2, standard=4, sheddable=4), tier=0),
              ModelDemand("low", demand(critical=3, standard=3), tier=1)]
    tier_major, _ = allocate(SPEC, models, Budgets(fleet_gpus=10), FleetState(), 0.0)
    assert tier_major.models["top"].replicas == 10 and tier_major.models["low"].replicas == 0
    class_major = FleetSpec(levels=tuple((t, c) for c in CLASSES for t in (0, 1)))
    decision, _ = allocate(class_major, models, Budgets(fleet_gpus=10), FleetState(), 0.0)
    # every critical first (5 replicas), then tier 0 standard (4), then tier 1 standard (the last one)
    assert decision.models["low"].replicas_by_class == {"critical": 3, "standard": 1}
    assert decision.models["top"].replicas_by_class == {"critical": 2, "standard": 4}


def test_levels_an_explicit_order_forgets_are_served_last_not_never():
    """Only tier 0's critical named: it comes first, then the default order of the rest (tier 1 included)."""
    models = [ModelDemand("top", demand(critical=2, standard=2), tier=0),
              ModelDemand("low", demand(critical=3), tier=1)]
    spec = FleetSpec(levels=((1, "critical"),))
    assert level_order(spec, models) == [(1, "critical"), (0, "critical"), (0, "standard"), (0, "sheddable"),
                                         (1, "standard"), (1, "sheddable")]
    decision, _ = allocate(spec, models, Budgets(fleet_gpus=4), FleetState(), 0.0)
    assert decision.models["low"].replicas == 3 and decision.models["top"].replicas == 1
    unbounded, _ = allocate(spec, models, Budgets(), FleetState(), 0.0)
    assert (unbounded.models["top"].replicas, unbounded.models["low"].replicas) == (4, 3)
    with pytest.raises(ValueError, match="classes"):
        FleetSpec(levels=((0, "premium"),))
    with pytest.raises(ValueError, match="twice"):
        FleetSpec(levels=((0, "critical"), (0, "critical")))


def test_timeline_ties_stay_with_the_incumbent():
    """Two equal models, 15 GPUs for 20 wanted: the odd replica stays where it was, tick after tick. Without
    the incumbent's credit the tie would go to "a" by name and the replica would move from "b" to "a"."""
    models = [ModelDemand("a", demand(standard=10)), ModelDemand("b", demand(standard=10))]
    state = FleetState(replicas={"a": 7, "b": 8})
    for tick in range(6):
        decision, state = allocate(SPEC, models, Budgets(fleet_gpus=15), state, tick * 15.0)
        assert (decision.models["a"].replicas, decision.models["b"].replicas) == (7, 8)


def test_timeline_warm_pool_shrinks_only_after_the_window():
    models = [ModelDemand("a", demand(critical=2), warm_slots=4), ModelDemand("b", demand(critical=2), warm_slots=4)]
    quiet = [replace(m, warm_slots=0) for m in models]
    state, held = FleetState(), FleetSpec(warm_stabilization_s=600.0)
    sizes = []
    for tick in range(60):
        decision, state = allocate(held, models if tick == 0 else quiet, Budgets(), state, tick * 15.0)
        sizes.append(decision.warm_by_shape.get(1, 0))
    assert sizes[0] == 6  # ceil(sqrt(16 + 16)) = 6, not 8
    assert set(sizes[: 600 // 15]) == {6} and sizes[600 // 15] == 0


def test_pooled_warm_capacity_is_below_the_sum_and_within_the_budget():
    models = [ModelDemand(f"m{i}", demand(critical=1), warm_slots=4) for i in range(4)]
    free, _ = allocate(SPEC, models, Budgets(), FleetState(), 0.0)
    assert free.warm_by_shape == {1: 8}  # sqrt(4 x 16): 8 slots, not 16
    assert sum(a.warm_slots for a in free.models.values()) == 8
    correlated, _ = allocate(FleetSpec(warm_correlation_ratio=1.0), models, Budgets(), FleetState(), 0.0)
    assert correlated.warm_by_shape == {1: 16}
    tight, _ = allocate(SPEC, models, Budgets(fleet_gpus=7), FleetState(), 0.0)
    assert tight.warm_by_shape == {1: 3} and tight.gpus_used == 7
    assert "capped by the budget" in tight.reasons[0]


def test_models_at_zero_have_their_wakes_insured_by_the_pooled_warm_capacity():
    """Four models at zero (no replica wanted) and one serving with a warm need of 2: the pool insures each
    wake's first replica (a risk of 1 each) together with the growth risk, ceil(sqrt(4 + 4)) = 3 slots, not
    4 + 2 = 6; each model at zero gets a share, and its reasons say so. With zero_wake_slots 0 (as before) only
    the serving model's 2 are pooled. A budget with room for the replica and 1 slot leaves the others' wakes to
    a new node, and their reasons say that too."""
    models = [ModelDemand(f"idle{i}", demand()) for i in range(4)]
    models.append(ModelDemand("busy", demand(critical=1), warm_slots=2))
    pooled, _ = allocate(SPEC, models, Budgets(), FleetState(), 0.0)
    assert pooled.warm_by_shape == {1: 3}
    assert sum(pooled.models[f"idle{i}"].warm_slots for i in range(4)) >= 1
    woken = next(m for m in pooled.models.values() if m.replicas == 0 and m.warm_slots)
    assert any("at zero, for its wake's first replica" in r for r in woken.reasons), woken.reasons
    before, _ = allocate(FleetSpec(warm_after="tier", zero_wake_slots=0), models, Budgets(), FleetState(), 0.0)
    assert before.warm_by_shape == {1: 2} and all(before.models[f"idle{i}"].warm_slots == 0 for i in range(4))
    tight, _ = allocate(SPEC, models, Budgets(fleet_gpus=2), FleetState(), 0.0)
    assert tight.models["busy"].replicas == 1 and tight.warm_by_shape == {1: 1}
    left = [m for name, m in tight.models.items() if name != "busy" and not m.warm_slots]
    assert left and all("a wake waits for a node" in " ".join(m.reasons) for m in left)
    with pytest.raises(ValueError, match="zero_wake_slots"):
        FleetSpec(zero_wake_slots=-1)


def test_reasons_name_the_budget_the_levels_and_the_shedding():
    models = [ModelDemand("model-a", demand(critical=4, standard=4), tier=0),
              ModelDemand("model-b", demand(critical=2, standard=2, sheddable=4), tier=1)]
    decision, _ = allocate(SPEC, models, Budgets(fleet_gpus=10), FleetState(), 0.0)
    b = decision.models["model-b"]
    assert b.replicas == 2 and b.shed == {"sheddable": 1.0}
    assert b.reasons[0].startswith("capped by fleet budget (10 GPUs): 2 of 8 replicas")
    assert "tier 1 standard, tier 1 sheddable not fully served" in b.reasons[0]
    assert "shedding 100% of sheddable" in b.reasons[1]
    assert "standard under-served and never shed" in b.reasons[2]
    assert decision.models["model-a"].reasons == ()  # model-b's 2 GPUs serve its critical class: not reclaimable


def test_a_namespace_cap_holds_its_models_and_the_others_take_the_rest():
    models = [ModelDemand("b1", demand(critical=4), namespace="team-b"),
              ModelDemand("b2", demand(critical=4), namespace="team-b"),
              ModelDemand("a", demand(sheddable=10), tier=2, namespace="team-a")]
    decision, _ = allocate(SPEC, models, Budgets(fleet_gpus=12, namespace_gpus={"team-b": 4}), FleetState(), 0.0)
    assert [decision.models[n].replicas for n in ("b1", "b2", "a")] == [2, 2, 8]
    assert decision.models["b1"].reasons[0].startswith("capped by namespace 'team-b' budget (4 GPUs): 2 of 4")


def test_nominal_quota_is_guaranteed_and_lent_while_unused():
    """Kueue-style: model-a's 8 nominal GPUs come before tier order; while it needs only 2, model-b borrows."""
    a = ModelDemand("model-a", demand(critical=2), tier=1, nominal_gpus=8)
    b = ModelDemand("model-b", demand(critical=12), tier=0, nominal_gpus=2)
    decision, _ = allocate(SPEC, [a, b], Budgets(fleet_gpus=10), FleetState(), 0.0)
    assert decision.models["model-b"].replicas == 8
    assert "6 GPUs of its nominal lent to model-b until model-a needs them" in decision.models["model-a"].reasons
    assert any("6 GPUs beyond its nominal 2 borrowed" in r for r in decision.models["model-b"].reasons)
    reclaimed, _ = allocate(SPEC, [replace(a, demand_replicas=demand(critical=8)), b], Budgets(fleet_gpus=10),
                            FleetState(), 15.0)
    assert (reclaimed.models["model-a"].replicas, reclaimed.models["model-b"].replicas) == (8, 2)


def test_borrowing_stops_at_the_borrowing_limit_and_the_rest_goes_to_others():
    """Kueue's borrowingLimit: model-b (nominal 4, may borrow 2) stops at 6 GPUs although the fleet has more;
    the lower tier takes the rest (work conserving within each model's limits)."""
    b = ModelDemand("model-b", demand(critical=12), tier=0, nominal_gpus=4, borrowing_limit_gpus=2)
    c = ModelDemand("model-c", demand(sheddable=12), tier=1)
    decision, _ = allocate(SPEC, [b, c], Budgets(fleet_gpus=10), FleetState(), 0.0)
    assert (decision.models["model-b"].replicas, decision.models["model-c"].replicas) == (6, 4)
    assert decision.models["model-b"].reasons[0].startswith(
        "capped by its nominal 4 + borrowing limit 2 (6 GPUs): 6 of 12 replicas")


def test_class_demand_splits_the_decision_by_arrival_shares():
    d = Decision(replicas=10)
    rates = {"critical": 2.0, "standard": 5.0, "sheddable": 3.0}
    assert class_demand(d, rates) == {"critical": 2, "standard": 5, "sheddable": 3}
    assert class_demand(Decision(replicas=3), rates) == {"critical": 1, "standard": 2, "sheddable": 0}
    assert class_demand(d, {}) == {"critical": 10, "standard": 0, "sheddable": 0}
    assert sum(class_demand(Decision(replicas=7), {"critical": 1.0, "sheddable": 2.0}).values()) == 7


def test_class_demand_ignores_broken_rates():
    rates = {"critical": math.nan, "standard": math.inf, "sheddable": -3.0}
    assert class_demand(Decision(replicas=4), rates) == {"critical": 4, "standard": 0, "sheddable": 0}
    assert class_demand(Decision(replicas=4), {"critical": math.inf, "standard": 1.0}) == {
        "critical": 0, "standard": 4, "sheddable": 0}


@pytest.mark.parametrize("fields, words", [
    ({"demand_replicas": {"critical": -1}}, "whole numbers >= 0"),
    ({"demand_replicas": {"critical": 1.5}}, "whole numbers >= 0"),
    ({"gpus_per_replica": 0}, "gpus_per_replica = 0"),
    ({"weight": 0.0}, "weight = 0.0"),
    ({"weight": math.nan}, "weight = nan"),
    ({"nominal_gpus": -2}, "must be >= 0"),
    ({"borrowing_limit_gpus": -1}, "must be >= 0"),
    ({"drain_s": -1.0}, "drain_s = -1.0"),
    ({"lead_time_s": math.inf}, "lead_time_s = inf"),
    ({"warm_window_s": -5.0}, "warm_window_s = -5.0"),
])
def test_bad_model_input_is_a_clear_error(fields, words):
    with pytest.raises(ValueError, match=words):
        ModelDemand(**{"name": "m", "demand_replicas": {"critical": 1}, **fields})


@settings(max_examples=200, deadline=None)
@given(fleets(), budgets(), st.dictionaries(st.sampled_from(CLASSES), st.floats(0, 1), max_size=3))
def test_shed_only_sheddable_classes_and_never_below_the_models_own(models, caps, own):
    models = [replace(m, shed=own) for m in models]
    decision, _ = allocate(SPEC, models, caps, FleetState(), 0.0)
    for m in models:
        shed = decision.models[m.name].shed
        assert set(shed) <= set(own) | set(m.sheddable)
        assert all(0.0 <= v <= 1.0 for v in shed.values())
        assert all(shed[c] >= v for c, v in own.items())
        for c in set(shed) - set(own):
            assert shed[c] > 0 and decision.models[m.name].replicas_by_class.get(c, 0) < m.demand_replicas[c]


def test_duplicate_names_are_refused():
    m = ModelDemand("a", demand(critical=1))
    try:
        allocate(SPEC, [m, m], Budgets(), FleetState(), 0.0)
    except ValueError as exc:
        assert "unique" in str(exc)
    else:
        raise AssertionError("duplicate names accepted")


def test_timeline_a_reclaim_waits_for_its_cost_then_takes_the_borrowed_gpus():
    """model-a lends 6 of its 8 nominal GPUs to model-b. Its claim returns at t = 15: a reclaim would drain
    model-b's replicas (30 s) and start model-a's (120 s), so for 150 s the claim is served only from GPUs
    nobody held (none here) and model-b keeps them; at t = 165 the claim is due and the GPUs go back."""
    a = ModelDemand("model-a", demand(critical=2), tier=1, nominal_gpus=8, lead_time_s=120.0)
    b = ModelDemand("model-b", demand(critical=12), tier=0, nominal_gpus=2, drain_s=30.0)
    budget = Budgets(fleet_gpus=10)
    lent, state = allocate(SPEC, [a, b], budget, FleetState(), 0.0)
    assert (lent.models["model-a"].replicas, lent.models["model-b"].replicas) == (2, 8)
    claim = replace(a, demand_replicas=demand(critical=8))
    held = []
    for now in (15.0, 90.0, 150.0, 165.0, 180.0):
        decision, state = allocate(SPEC, [claim, b], budget, state, now)
        held.append((decision.models["model-a"].replicas, decision.models["model-b"].replicas))
        if now == 15.0:
            assert ("nominal claim waits 150 s more before reclaiming GPUs others hold (a reclaim costs 150 s: "
                    "its start-up and their drain)") in decision.models["model-a"].reasons
    assert held == [(2, 8), (2, 8), (2, 8), (8, 2), (8, 2)]
    assert state.claim_since == {}


def test_a_new_claim_takes_what_nobody_held_at_once():
    """The same claim with 3 GPUs free last tick (fleet cap 13): model-a gets those 3 at once, no reclaim."""
    a = ModelDemand("model-a", demand(critical=2), tier=1, nominal_gpus=8, lead_time_s=120.0)
    b = ModelDemand("model-b", demand(critical=8), tier=0, nominal_gpus=2, drain_s=30.0)
    _, state = allocate(SPEC, [a, b], Budgets(fleet_gpus=13), FleetState(), 0.0)
    claim = replace(a, demand_replicas=demand(critical=8))
    decision, state = allocate(SPEC, [claim, b], Budgets(fleet_gpus=13), state, 15.0)
    assert (decision.models["model-a"].replicas, decision.models["model-b"].replicas) == (5, 8)
    assert state.claim_since == {"model-a": 15.0}


def test_a_new_claim_waits_for_gpus_its_namespace_held_as_for_the_fleets():
    """The fleet cap has room (4 GPUs, 2 held last tick), but namespace team-b's cap (2) was held by model-b:
    model-a's claim, not yet due, must not take it from model-b (a reclaim before its cost is paid). Found by
    test_more_gpus_never_lower_anyones_allocation: with the fleet cap at 2, model-b kept its replica; at 4,
    model-a's claim took the namespace's GPUs and model-b got none."""
    a = ModelDemand("model-a", demand(sheddable=1), gpus_per_replica=2, namespace="team-b", nominal_gpus=4)
    b = ModelDemand("model-b", demand(sheddable=2), gpus_per_replica=2, namespace="team-b")
    other = ModelDemand("model-c", demand(), gpus_per_replica=2, namespace="team-a", drain_s=30.0)
    previous = FleetState(replicas={"model-a": 0, "model-b": 1})
    for cap in (2, 4):
        decision, state = allocate(SPEC, [a, b, other], Budgets(fleet_gpus=cap, namespace_gpus={"team-b": 2}),
                                   previous, 0.0)
        assert (decision.models["model-a"].replicas, decision.models["model-b"].replicas) == (0, 1)
        assert state.claim_since == {"model-a": 0.0}
    # once due (its horizon: model-c's 30-s drain), the claim takes the namespace's GPUs back
    decision, _ = allocate(SPEC, [a, b, other], Budgets(fleet_gpus=4, namespace_gpus={"team-b": 2}), state, 30.0)
    assert (decision.models["model-a"].replicas, decision.models["model-b"].replicas) == (1, 0)


@st.composite
def timed(draw):
    """A fleet with start-up and drain times, the budgets, last tick's replicas, and how far past its reclaim
    horizon each claim is (negative: not yet due)."""
    models = [replace(m, lead_time_s=draw(st.sampled_from([None, 0.0, 60.0, 300.0])),
                      drain_s=draw(st.sampled_from([0.0, 30.0]))) for m in draw(fleets())]
    previous = {m.name: draw(st.integers(0, 12)) for m in models}
    past = {m.name: draw(st.sampled_from([-100.0, 0.0, 50.0])) for m in models}
    return models, draw(budgets()), previous, past


@settings(max_examples=300, deadline=None)
@given(timed())
def test_a_reclaim_is_only_postponed_and_never_above_a_budget(case):
    """Once every claim has waited its horizon, the allocation is the one without reclaim costs; before,
    every budget still holds."""
    from policies.fleet import horizon_s

    models, caps, previous, past = case
    now = 1000.0
    since = {m.name: now - horizon_s(m, models) - past[m.name] for m in models}
    last = FleetSpec(warm_after="last")  # the drains also rank warm slots (tested apart): not here
    waited, _ = allocate(last, models, caps, FleetState(replicas=previous, claim_since=since), now)
    for m in models:
        assert waited.models[m.name].replicas * m.gpus_per_replica <= m.max_gpus
    assert caps.fleet_gpus is None or waited.gpus_used <= caps.fleet_gpus
    for ns, cap in caps.namespace_gpus.items():
        assert gpus(models, waited, namespace=ns) <= cap
    if all(p >= 0 for p in past.values()):
        free = [replace(m, lead_time_s=None, drain_s=0.0) for m in models]
        at_once, _ = allocate(last, free, caps, FleetState(replicas=previous), now)
        assert {n: a.replicas for n, a in waited.models.items()} == {n: a.replicas for n, a in at_once.models.items()}
        assert waited.warm_by_shape == at_once.warm_by_shape


def tier_gets(models, decision, tier):
    return {m.name: decision.models[m.name].replicas for m in models if m.tier <= tier}


@settings(max_examples=300, deadline=None)
@given(fleets(), budgets(), st.integers(0, 2))
def test_a_tiers_early_warm_slots_come_after_its_replicas_and_before_lower_tiers(models, caps, tier):
    """The early warm slots do not make a level take GPUs a higher level needs: removing every lower tier's
    demand changes no replicas of the tiers up to `tier`. With one replica shape, a lower tier holds a
    replica only once the pooled early warm need of the tiers up to `tier` is reserved in full. (Nominal
    quotas, a level of their own before every tier, left out.)"""
    models = [replace(m, nominal_gpus=0) for m in models]
    trimmed = [m if m.tier <= tier else replace(m, demand_replicas=demand()) for m in models]
    full, _ = allocate(SPEC, models, caps, FleetState(), 0.0)
    alone, _ = allocate(SPEC, trimmed, caps, FleetState(), 0.0)
    assert tier_gets(models, full, tier) == tier_gets(trimmed, alone, tier)
    one = [replace(m, gpus_per_replica=2) for m in models]
    decision, _ = allocate(SPEC, one, caps, FleetState(), 0.0)
    upper = [m for m in one if m.tier <= tier]
    need = math.ceil(round(math.sqrt(sum(early_warm_slots(m, one) ** 2 for m in upper)), 9))
    if any(decision.models[m.name].replicas for m in one if m.tier > tier):
        assert sum(decision.models[m.name].warm_slots for m in upper) >= need


def test_the_top_tiers_warm_slot_comes_before_the_lowest_tiers_replicas_by_the_drain_it_saves():
    """The live fleet's shape: 14 GPUs, chat (tier 0) holds 8 and its growth risk over its 120-s lead time is
    4 replicas; batch (tier 2) wants 7 and drains in 30 s. A reclaim of batch would add 30 s to chat's
    start-up, so chat's risk over 30 s, ceil(4 x 30 / 120) = 1 slot, comes before batch's replicas: batch
    gets 3. Without a drain (or with the warm slots ranked last, the previous rule) batch takes every GPU and
    chat has no warm slot. "critical": chat's slot right after its critical class, before its standard."""
    chat = ModelDemand("chat", demand(critical=2, standard=4, sheddable=2), tier=0, warm_slots=4, lead_time_s=120.0)
    code = ModelDemand("code", demand(critical=1, standard=1), tier=1)
    batch = ModelDemand("batch", demand(critical=2, standard=3, sheddable=2), tier=2, warm_slots=2, drain_s=30.0)
    fleet = [chat, code, batch]
    assert [early_warm_slots(m, fleet) for m in fleet] == [1, 0, 0]
    # its warm need covers growth over its node provisioning (120 s), whatever its lead time: a free pooled
    # slot drops the lead time to a 20-s start-up, not the early part to the whole need
    assert early_warm_slots(replace(chat, lead_time_s=20.0, warm_window_s=120.0), fleet) == 1
    assert early_warm_slots(replace(chat, lead_time_s=20.0), fleet) == 4
    decision, _ = allocate(SPEC, fleet, Budgets(fleet_gpus=14), FleetState(), 0.0)
    assert [(decision.models[n].replicas, decision.models[n].warm_slots) for n in ("chat", "code", "batch")] == [
        (8, 1), (2, 0), (3, 0)]
    assert decision.warm_by_shape == {1: 1} and decision.gpus_used == 14
    said = "1 warm slot for tier 0 before tier 2's replicas"
    assert any(r.startswith(said) for r in decision.models["batch"].reasons)
    assert any(r.startswith(said) for r in decision.reasons)
    assert not any("warm slot for tier" in r for r in decision.models["chat"].reasons)
    for spec, models in ((FleetSpec(warm_after="last"), fleet), (SPEC, [chat, code, replace(batch, drain_s=0.0)])):
        last, _ = allocate(spec, models, Budgets(fleet_gpus=14), FleetState(), 0.0)
        assert [last.models[n].replicas for n in ("chat", "code", "batch")] == [8, 2, 4]
        assert last.warm_by_shape == {1: 0}
    early, _ = allocate(FleetSpec(warm_after="critical"), [replace(chat, warm_slots=8), batch],
                        Budgets(fleet_gpus=7), FleetState(), 0.0)
    assert (early.models["chat"].replicas_by_class, early.models["chat"].warm_slots) == (
        {"critical": 2, "standard": 3}, 2)
    with pytest.raises(ValueError, match="warm_after = 'never'"):
        FleetSpec(warm_after="never")


def test_a_higher_tier_counts_lower_tiers_sheddable_gpus_as_reclaimable_once_the_cap_binds():
    """14 GPUs held by chat (tier 0, 4), code (tier 1: 2 critical, 1 sheddable) and batch (tier 2: 2 critical,
    2 standard, 3 sheddable): the cap binds. What the fleet would take back first is the trailing sheddable
    levels: batch's 3 sheddable replicas (tier 2 standard, never shed, ends the run; code's sheddable one comes
    after batch's critical and standard, so it is not counted): 3 for chat and for code, none for batch.
    With room for a new node under the cap (20 GPUs) or no cap, nothing is reclaimed (a node comes instead).
    A namespace cap and a lower tier's nominal quota hold."""
    models = [ModelDemand("chat", demand(critical=4), tier=0, namespace="chat"),
              ModelDemand("code", demand(critical=2, sheddable=1), tier=1, namespace="code"),
              ModelDemand("batch", demand(critical=2, standard=2, sheddable=3), tier=2, namespace="batch")]

    def reclaimable(caps, ms=models):
        decision, _ = allocate(SPEC, ms, caps, FleetState(), 0.0)
        return {name: a.reclaimable_replicas for name, a in decision.models.items()}

    assert reclaimable(Budgets(fleet_gpus=14)) == {"chat": 3, "code": 3, "batch": 0}
    assert reclaimable(Budgets(fleet_gpus=20)) == reclaimable(Budgets()) == {"chat": 0, "code": 0, "batch": 0}
    assert reclaimable(Budgets(fleet_gpus=14, namespace_gpus={"chat": 5}))["chat"] == 1
    assert reclaimable(Budgets(fleet_gpus=14), [*models[:2], replace(models[2], nominal_gpus=5)])["chat"] == 2
    no_shed = [*models[:2], replace(models[2], demand_replicas=demand(critical=7))]
    assert reclaimable(Budgets(fleet_gpus=14), no_shed) == {"chat": 0, "code": 0, "batch": 0}
    decision, _ = allocate(SPEC, models, Budgets(fleet_gpus=14), FleetState(), 0.0)
    assert any(r.startswith("3 replicas' GPUs reclaimable at once from lower tiers' sheddable classes") for r in
               decision.models["chat"].reasons)


@settings(max_examples=300, deadline=None)
@given(fleets(shapes=(1,)), budgets(), st.data())
def test_what_a_model_may_reclaim_the_fleet_gives_it(models, caps, data):
    """One replica shape, tier-major: a model that asks for its reclaimable replicas more (at its highest
    class) gets them, on top of what it had."""
    decision, _ = allocate(SPEC, models, caps, FleetState(), 0.0)
    m = data.draw(st.sampled_from(models))
    extra = decision.models[m.name].reclaimable_replicas
    top = CLASSES[0]
    asked = replace(m, demand_replicas={**m.demand_replicas, top: m.demand_replicas[top] + extra})
    again, _ = allocate(SPEC, [asked if o is m else o for o in models], caps, FleetState(), 0.0)
    assert again.models[m.name].replicas >= decision.models[m.name].replicas + extra
