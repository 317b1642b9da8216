"""The load generator sends vLLM's `priority` for the class, and a fake server with `--scheduling-policy
priority` serves critical first in a surge: a short real run over loopback, both policies."""

import asyncio

from loadtest.loadgen import BODY_PRIORITY, Request, completion_body
from loadtest.priosurge import run_policy, summary, surge_requests


def test_the_body_carries_the_class_priority_only_when_asked():
    r = Request(0, 0.0, "sheddable", 3, 4)
    assert "priority" not in completion_body(r)
    assert completion_body(r, priority_in_body=True)["priority"] == BODY_PRIORITY["sheddable"] == 2
    assert completion_body(Request(0, 0.0, "critical", 1, 1), priority_in_body=True)["priority"] == 0
    assert completion_body(Request(0, 0.0, "batch", 1, 1), priority_in_body=True)["priority"] == 2


def test_in_a_surge_critical_waits_less_with_priority_scheduling(tmp_path):
    """Two slots of 0.2 s at 80 % busy, three times that rate for the middle 1.3 s: a queue of a dozen or
    more builds. First come first served, critical waits as long as anyone; by priority it only waits for
    a slot to free, and the sheddable requests wait longer instead."""
    requests = surge_requests(seconds=4.0, rate_per_s=8.0, surge_ratio=3.0, output_tokens=10, seed=3)
    waits = {}
    for policy in ("fcfs", "priority"):
        records = asyncio.run(run_policy(policy, requests, concurrency=2, decode_s_per_token=0.02,
                                         out=tmp_path / policy))
        assert len(records) == len(requests) and all(r["status"] == 200 for r in records)
        waits[policy] = summary(records, slo_s=2.0)
    assert waits["fcfs"]["critical"]["max_s"] > 0.6
    assert waits["priority"]["critical"]["max_s"] < waits["fcfs"]["critical"]["max_s"] / 2
    assert waits["priority"]["sheddable"]["max_s"] > waits["fcfs"]["sheddable"]["max_s"]
