"""NodeWaits at its seam (`Kube.call`): a node that cannot be read. The real control plane:
tests/test_capacity_kube.py::test_a_pod_that_waited_for_a_new_node_teaches_node_provisioning_by_node_type."""

import asyncio
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace as NS

from autoscaler.errors import PermanentError, TransientError
from autoscaler.kube import nodewaits
from autoscaler.kube.nodewaits import NodeWaits
from autoscaler.kube.pods import pod_facts

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def pod(uid: str, node: str, created_s: float, placed_s: float):
    scheduled = NS(type="PodScheduled", status="True", last_transition_time=T0 + timedelta(seconds=placed_s))
    return NS(metadata=NS(uid=uid, creation_timestamp=T0 + timedelta(seconds=created_s)),
              spec=NS(node_name=node), status=NS(conditions=[scheduled]))


def node(created_s: float, kind: str = "p5.48xlarge"):
    return NS(metadata=NS(creation_timestamp=T0 + timedelta(seconds=created_s),
                          labels={"node.kubernetes.io/instance-type": kind}))


class FakeKube:
    def __init__(self, nodes: dict, errors: dict | None = None):
        self.nodes, self.errors, self.reads = nodes, errors or {}, []
        self.core = NS(read_node=None)

    async def call(self, what, fn, name):
        self.reads.append(name)
        if name in self.errors:
            raise self.errors.pop(name)
        return self.nodes[name]


def learn(waits: NodeWaits, pods):
    return asyncio.run(waits.learn([pod_facts(p) for p in pods]))


def test_a_node_read_that_fails_for_now_is_tried_again_and_a_forbidden_one_never():
    kube = FakeKube({"new": node(100.0)}, errors={"new": TransientError("get node: timeout")})
    waits = NodeWaits(kube)
    pods = [pod("a", "new", 0.0, 420.0)]
    assert learn(waits, pods) == ()
    assert learn(waits, pods) == (("p5.48xlarge", 420.0),)  # asked again, then counted once
    assert learn(waits, pods) == ()
    forbidden = FakeKube({"new": node(100.0)}, errors={"new": PermanentError("get node: 403", kind="forbidden")})
    waits = NodeWaits(forbidden)
    assert learn(waits, pods) == () and learn(waits, [pod("b", "new", 0.0, 420.0)]) == ()
    assert forbidden.reads == ["new"]  # no GET per tick once the controller knows it may not


def test_a_large_fleets_first_read_reads_a_few_nodes_per_tick():
    many = {f"n{i}": node(-10.0) for i in range(3 * nodewaits.NODE_READS_PER_TICK)}
    kube = FakeKube(many)
    waits = NodeWaits(kube)
    pods = [pod(f"p{i}", f"n{i}", 0.0, 1.0) for i in range(len(many))]
    for _ in range(3):
        assert learn(waits, pods) == ()  # the nodes were there before the pods: no wait for a new node
        assert len(kube.reads) <= nodewaits.NODE_READS_PER_TICK * (_ + 1)
    assert sorted(kube.reads) == sorted(many)  # every node read once, over three ticks
