"""The stage order is written once, in `policies.engine.STAGES`: docs/stages.md and the stage modules'
docstrings are numbered from it, and `decide` is a fold over it."""

import math
import re
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path

import pytest

import policies
from policies import ClusterState, PolicySpec, Sample, Signals, engine, initial_state
from policies.stages import sanitize
from policies.types import ForecastState, PolicyState, Tick

ROOT = Path(__file__).resolve().parent.parent
STAGES_DOC = ROOT / "docs" / "stages.md"
ENTRY = re.compile(r"^(\d+)\. \*\*(\w+)\*\*", re.MULTILINE)
MENTION = re.compile(r"\bstage (\d+)(\w*)(?:, (\w+))?", re.IGNORECASE)


def stage_names(stages) -> list[str]:
    """A stage is the function `stage` of its module; its name is the module's."""
    return [fn.__module__.rsplit(".", 1)[1] for fn in stages]


def doc_mismatches(names: list[str], doc: str) -> list[str]:
    entries = [(int(n), name) for n, name in ENTRY.findall(doc)]
    expected = list(enumerate(names, 1))
    return [] if entries == expected else [f"docs/stages.md lists {entries}, the tuple is {expected}"]


def mention_mismatches(names: list[str], where: str, text: str) -> list[str]:
    """Every "stage N" in the text must read "stage N, <name of the N-th stage>"."""
    wrong = []
    for m in MENTION.finditer(text):
        n, suffix, name = int(m.group(1)), m.group(2), m.group(3)
        if suffix or not 1 <= n <= len(names) or name != names[n - 1]:
            wrong.append(f"{where}: {m.group(0)!r} (stage {n} is {names[n - 1] if 1 <= n <= len(names) else 'none'})")
    return wrong


def test_every_stage_is_the_stage_function_of_its_own_module():
    names = stage_names(engine.STAGES)
    assert all(fn.__name__ == "stage" for fn in engine.STAGES)
    assert len(set(names)) == len(names)


def test_docs_list_the_stages_in_the_tuple_order():
    assert doc_mismatches(stage_names(engine.STAGES), STAGES_DOC.read_text()) == []


def test_stage_docstrings_are_numbered_from_the_tuple():
    names = stage_names(engine.STAGES)
    for i, fn in enumerate(engine.STAGES, 1):
        doc = sys.modules[fn.__module__].__doc__ or ""
        assert doc.startswith(f"Stage {i}, {names[i - 1]}:"), (fn.__module__, doc.splitlines()[:1])
    wrong = []
    for path in sorted(Path(policies.__file__).parent.rglob("*.py")):
        wrong += mention_mismatches(names, path.name, path.read_text())
    wrong += mention_mismatches(names, "docs/stages.md", STAGES_DOC.read_text())
    assert wrong == []
    numbered = re.findall(r"^    (\w+)\.stage,  # (\d+):", Path(engine.__file__).read_text(), re.MULTILINE)
    assert [(name, int(n)) for name, n in numbered] == [(name, i) for i, name in enumerate(names, 1)]


def test_the_checks_see_a_wrong_order_and_a_wrong_number():
    names = stage_names(engine.STAGES)
    swapped = [names[1], names[0]] + names[2:]
    assert doc_mismatches(swapped, STAGES_DOC.read_text())
    assert mention_mismatches(names, "x", f"Stage 2, {names[0]}: ...")
    assert mention_mismatches(names, "x", "Stage 9b: never order more")
    assert not mention_mismatches(names, "x", f"(stage 3, {names[2]})")


def test_decide_folds_over_the_tuple_and_a_hold_ends_it(monkeypatch):
    order = [s.__module__ for s in engine.STAGES]
    seen = []

    def spy(stage):
        def run(spec, tick):
            seen.append(stage.__module__)
            return stage(spec, tick)
        return run

    monkeypatch.setattr(engine, "STAGES", tuple(spy(s) for s in engine.STAGES))
    cluster = ClusterState(spec_replicas=4, ready_replicas=4, at_s=0.0)
    rate = Sample(10.0, 0.0)
    d, _ = engine.decide(PolicySpec(), initial_state(), Signals(cluster=cluster, arrival_rate_per_s=rate), 0.0)
    assert d.valid and seen == order
    seen.clear()
    d, _ = engine.decide(PolicySpec(), initial_state(), Signals(cluster=cluster), 0.0)  # no demand signal
    assert not d.valid and seen == order[:2] and seen[-1].endswith(".learn")


def test_a_tick_is_frozen():
    tick = Tick(signals=Signals(), now=0.0, state=initial_state())
    with pytest.raises(AttributeError):
        tick.replicas = 3  # type: ignore[misc]
    assert tick.then(["x"], replicas=3) == replace(tick, replicas=3, reasons=("x",))


def test_a_tick_copy_shares_nothing_mutable_with_its_original_and_checks_its_field_names():
    tick = Tick(signals=Signals(), now=0.0, state=initial_state(), reasons=("a",))
    copy = tick.then(["b"], replicas=2)
    assert (tick.replicas, tick.reasons) == (0, ("a",)) and (copy.replicas, copy.reasons) == (2, ("a", "b"))
    assert copy.__dict__ is not tick.__dict__
    with pytest.raises(AttributeError):
        copy.replicas = 5  # type: ignore[misc]
    with pytest.raises(TypeError, match="no field"):
        tick.then(replica=2)


def test_a_state_copy_is_the_value_replace_gives_frozen_and_checks_its_field_names():
    state = initial_state()
    copy = state.changed(last_replicas=4, seen=frozenset({"queue_depth"}))
    assert copy == replace(state, last_replicas=4, seen=frozenset({"queue_depth"}))
    assert type(copy) is type(state) and state.last_replicas is None and copy.__dict__ is not state.__dict__
    with pytest.raises(AttributeError):
        copy.last_replicas = 5  # type: ignore[misc]
    with pytest.raises(TypeError, match="PolicyState has no field"):
        state.changed(last_replica=4)


def test_a_copy_that_changes_nothing_is_the_original_and_an_equal_value_still_copies():
    """A change to the very object a field holds returns the original (nothing to copy); a value that is only
    equal (-0.0 and 0.0, a float computed afresh) is still copied in, so the fields keep their bits."""
    state = initial_state().changed(headroom_ratio=0.0, seen=frozenset({"queue_depth"}))
    assert state.changed(headroom_ratio=state.headroom_ratio, seen=state.seen) is state
    negative = state.changed(headroom_ratio=-0.0)
    assert negative is not state and math.copysign(1.0, negative.headroom_ratio) == -1.0
    tick = Tick(signals=Signals(), now=0.0, state=state, reasons=("a",))
    assert tick.then() is tick and tick.then((), state=state, replicas=0) is tick
    assert tick.then(["a"]) is not tick and tick.then(["a"]).reasons == ("a", "a")
    with pytest.raises(TypeError, match="no field"):
        tick.then(replica=tick.replicas)


def test_sanitize_keeps_the_state_when_nothing_new_is_reported():
    """The signals seen are remembered as a set; a tick that reports none it has not seen keeps the very set,
    and with it the state (nothing to copy); a new signal joins it."""
    cluster = ClusterState(spec_replicas=4, ready_replicas=4, at_s=0.0)
    first = Signals(cluster=cluster, arrival_rate_per_s=Sample(10.0, 0.0))
    state = sanitize.stage(PolicySpec(), Tick(signals=first, now=0.0, state=initial_state())).state
    assert sanitize.stage(PolicySpec(), Tick(signals=first, now=0.0, state=state)).state is state
    more = Signals(cluster=cluster, arrival_rate_per_s=Sample(10.0, 0.0), queue_depth=Sample(0.0, 0.0))
    grown = sanitize.stage(PolicySpec(), Tick(signals=more, now=0.0, state=state)).state
    assert grown.seen == state.seen | {"queue_depth"} and "queue_depth" not in state.seen


@pytest.mark.parametrize("kind, name", [(PolicyState, f.name) for f in fields(PolicyState)]
                         + [(ForecastState, f.name) for f in fields(ForecastState)])
def test_a_state_copy_changes_every_field_as_replace_does(kind, name):
    state, value = kind(), object()  # a value no field holds by default
    copy = state.changed(**{name: value})
    assert copy == replace(state, **{name: value}) and getattr(copy, name) is value
    assert all(getattr(copy, f.name) is getattr(state, f.name) for f in fields(kind) if f.name != name)
    with pytest.raises(TypeError, match=f"{kind.__name__} has no field"):
        state.changed(**{name + "_": value})


def test_the_dict_copy_skips_no_validation_a_subclass_adds():
    """The dict copy skips `__init__`: it is only right while neither class has a `__post_init__`; a subclass
    that validates (or adds fields) is copied by `dataclasses.replace`."""
    assert not any(hasattr(kind, "__post_init__") for kind in (PolicyState, Tick, ForecastState))

    @dataclass(frozen=True)
    class Checked(PolicyState):
        extra: int = 0

        def __post_init__(self):
            if self.extra < 0:
                raise ValueError("extra < 0")

    checked = Checked()
    assert checked.changed(extra=2, last_replicas=3) == Checked(extra=2, last_replicas=3)
    with pytest.raises(ValueError, match="extra < 0"):
        checked.changed(extra=-1)
