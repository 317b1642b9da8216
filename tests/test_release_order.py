"""The pure release logic the admission endpoint and the simulators share (`policies.release`)."""

from policies import Decision
from policies.release import PerReplica, ReleaseOrder, per_replica, per_replica_of, room


def test_release_order_is_highest_priority_first_then_arrival():
    order: ReleaseOrder[str] = ReleaseOrder()
    for priority, name in [(0, "s1"), (1, "c1"), (0, "s2"), (2, "top"), (1, "c2")]:
        order.push(priority, name)
    assert list(order) == ["top", "c1", "c2", "s1", "s2"] and order.peek() == "top"
    assert [order.pop() for _ in range(len(order))] == ["top", "c1", "c2", "s1", "s2"]


def test_room_is_slots_and_allowance_less_what_is_busy_or_released():
    per = PerReplica(slots=8, allowance=2.0, drain_per_s=0.8)
    assert room(ready=2, slots=8, per=per, occupied=15) == 5
    assert room(ready=2, slots=8, per=per, occupied=15, releasing=3) == 2
    assert room(ready=1, slots=8, per=None, occupied=0) == 8  # before any decision with a Ready replica
    assert room(ready=0, slots=8, per=per, occupied=0) == 0


def test_per_replica_from_a_decisions_saturation_figures():
    assert per_replica_of(slots=16, depths={"standard": 10, "sheddable": 4}, drain_per_s=4.0, replica_slots=8) == \
        PerReplica(8, 5.0, 2.0)
    assert per_replica_of(slots=0, depths={"standard": 10}, drain_per_s=0.0, replica_slots=8) is None
    decision = Decision(replicas=2, saturation_slots=16, saturation_queue_depth={"standard": 10},
                        saturation_drain_per_s=4.0)
    assert per_replica(decision, 8) == PerReplica(8, 5.0, 2.0)
