"""The control loop with fakes at its own seams: what it writes, when, and how it holds on faults."""

import asyncio

import pytest

from autoscaler.board import DecisionBoard
from autoscaler.clock import ManualClock
from autoscaler.config import Settings
from autoscaler.errors import TransientError
from autoscaler.loop import Controller
from autoscaler.metrics import ControllerMetrics
from autoscaler.signals.prometheus import QueryResult
from policies import ClusterState, PolicySpec, Sample


class Source:
    def __init__(self, values, *, fail=None, delay_s=0.0):
        self.values, self.fail, self.delay_s = values, fail, delay_s

    async def collect(self, now):
        await asyncio.sleep(self.delay_s)
        if self.fail is not None:
            raise self.fail
        return QueryResult(samples={k: Sample(v, now) for k, v in self.values.items()})


class Cluster:
    def __init__(self, replicas):
        self.replicas = replicas
        self.fail = None

    async def read(self, now):
        if self.fail is not None:
            raise self.fail
        return ClusterState(spec_replicas=self.replicas, ready_replicas=self.replicas, at_s=now)

    async def pod_template(self):
        return "template"


class Scaler:
    def __init__(self, cluster, fail=None):
        self.cluster, self.calls, self.fail = cluster, [], fail

    async def scale(self, replicas):
        self.calls.append(replicas)
        if self.fail is not None:
            raise self.fail
        before, self.cluster.replicas = self.cluster.replicas, replicas
        return (before, replicas) if before != replicas else None


class Warm:
    name = "model-warm-pool"

    def __init__(self):
        self.calls = []

    async def ensure(self, template, slots):
        self.calls.append(slots)

    async def ready(self):
        return 0


class Events:
    def __init__(self):
        self.calls = []

    async def scaled(self, **kw):
        self.calls.append(kw)


def settings(mode="actuate", **policy):
    return Settings(target={"namespace": "llm", "name": "m"}, mode=mode,
                    prometheus={"url": "http://prom:9090"}, policy=PolicySpec(replica_concurrency=8, **policy))


def controller(mode="actuate", *, values=None, leader=True, replicas=2, source_kw=None, scaler_fail=None):
    cluster = Cluster(replicas)
    c = Controller(
        settings=settings(mode), sources=[Source(values or {"arrival_rate_per_s": 80.0, "in_flight": 80.0,
                                                            "queue_depth": 0.0, "service_time_s": 1.0},
                                                 **(source_kw or {}))],
        cluster=cluster, board=DecisionBoard(), metrics=ControllerMetrics(),
        scaler=Scaler(cluster, scaler_fail), warm_pool=Warm(), events=Events(), is_leader=lambda: leader,
        clock=ManualClock(1000.0),
    )
    return c, cluster


def ticks(c, n):
    """`n` ticks, one period apart on the controller's clock."""
    async def go():
        decisions = []
        for _ in range(n):
            decisions.append(await c.tick())
            await c.clock.advance(c.settings.tick_s)
        return decisions

    return asyncio.run(go())


def errors(c, kind):
    return c.metrics.registry.get_sample_value("autoscaler_errors_total", {"kind": kind}) or 0


def test_actuate_mode_scales_publishes_and_records_an_event():
    c, cluster = controller()
    decisions = ticks(c, 3)
    assert decisions[-1].replicas > 2 and cluster.replicas == decisions[-1].replicas
    assert c.board.latest.replicas == cluster.replicas
    assert c.events.calls and c.events.calls[0]["after"] > c.events.calls[0]["before"]
    assert c.warm_pool.calls  # the pool is reconciled every tick
    assert c.metrics.registry.get_sample_value("autoscaler_decided_replicas") == cluster.replicas


@pytest.mark.parametrize("mode,leader", [("shadow", True), ("keda", True), ("actuate", False)])
def test_shadow_keda_and_followers_write_nothing(mode, leader):
    c, cluster = controller(mode, leader=leader)
    decisions = ticks(c, 3)
    assert decisions[-1].replicas > 2  # decided...
    assert c.scaler.calls == [] and c.warm_pool.calls == [] and cluster.replicas == 2  # ...but not written


def test_a_lease_that_ends_during_the_tick_stops_the_writes_after_it():
    """The Lease (a shard's, fenced by time) is checked again right before each write, not only once per tick:
    one that ends while the tick decides or warns writes neither the scale nor the warm pool."""
    c, cluster = controller()
    answers = iter([True])  # held at the tick's check, ended by the time of the writes
    c.is_leader = lambda: next(answers, False)
    ticks(c, 1)
    assert c.scaler.calls == [] and c.warm_pool.calls == [] and cluster.replicas == 2


def test_prometheus_down_holds_and_is_counted():
    c, cluster = controller(replicas=12)
    ticks(c, 2)
    c.sources[0].fail = TransientError("refused", kind="prometheus_unavailable")
    held = ticks(c, 5)
    assert all(not d.valid for d in held)
    assert cluster.replicas >= 12 and all(r >= 12 for r in c.scaler.calls)
    assert errors(c, "prometheus_unavailable") == 5
    c.sources[0].fail = None
    assert ticks(c, 1)[0].valid  # recovers


def test_a_slow_source_misses_the_deadline_and_the_tick_still_decides():
    c, _ = controller(source_kw={"delay_s": 30.0})
    c.settings = settings().model_copy(update={"tick_deadline_s": 0.3})
    [decision] = ticks(c, 1)
    assert not decision.valid and errors(c, "tick_deadline") == 1


def test_apiserver_errors_are_counted_and_do_not_crash():
    c, cluster = controller(scaler_fail=TransientError("503", kind="apiserver_unavailable"))
    ticks(c, 3)
    assert errors(c, "apiserver_unavailable") >= 1 and cluster.replicas == 2
    c.cluster.fail = TransientError("503", kind="apiserver_unavailable")
    [decision] = ticks(c, 1)
    assert not decision.valid and "no usable cluster state" in decision.reasons[0]


def test_run_ticks_once_per_period_until_stopped():
    c, _ = controller()

    def count():
        return c.metrics.registry.get_sample_value("autoscaler_loop_duration_seconds_count") or 0

    async def go():
        stop = asyncio.Event()
        task = asyncio.create_task(c.run(stop))
        await c.clock.advance(0.0)
        await c.clock.asleep()  # the first tick's decide (a thread) is done and the loop waits again
        seen = [count()]
        for _ in range(3):
            await c.clock.advance(7.0)  # mid-period: no tick
            await c.clock.asleep()
            seen.append(count())
            await c.clock.advance(8.0)  # the period is over: one tick
            await c.clock.asleep()
            seen.append(count())
        stop.set()
        await asyncio.wait_for(task, 2)  # stop ends the wait at once
        return seen

    assert asyncio.run(go()) == [1, 1, 2, 2, 3, 3, 4]


def test_demand_counts_what_the_gateway_shed():
    """Servers count completions; while the gateway sheds, the admission endpoint saw more. The larger is
    the demand the policy gets; without admission counts the servers' rate stands."""
    from autoscaler.loop import PriorityCounter

    c, _ = controller(values={"arrival_rate_per_s": 10.0, "in_flight": 10.0, "queue_depth": 0.0,
                              "service_time_s": 1.0})

    async def collect(now):
        return await c.collect(now)

    assert asyncio.run(collect(1000.0)).arrival_rate_per_s.value == 10.0  # no admission counter
    c.priorities = PriorityCounter()
    asyncio.run(collect(1000.0))
    for _ in range(300):  # 300 requests in 15 s = 20 req/s, half of them shed (servers saw 10 req/s)
        c.priorities.add("sheddable")
    signals = asyncio.run(collect(1015.0))
    assert signals.arrival_rate_per_s.value == 20.0 and signals.arrival_rate_by_priority == {"sheddable": 20.0}
    for _ in range(60):
        c.priorities.add("critical")
    assert asyncio.run(collect(1030.0)).arrival_rate_per_s.value == 10.0  # 4 req/s counted < 10 served


def test_at_zero_the_requests_held_are_the_arrival_rate():
    """At zero no server reports a rate (the query finds no series); the admission endpoint counted each held
    request when its hold started: while it holds requests, that count is the arrival rate. Without a hold a
    missing rate stays missing (the policy holds on missing data). Before, the rate stayed missing at zero."""
    from autoscaler.loop import PriorityCounter

    c, _ = controller(values={"in_flight": 0.0, "queue_depth": 0.0, "service_time_s": 1.0}, replicas=0)
    c.reports_held, c.priorities = True, PriorityCounter()

    async def collect(now):
        return await c.collect(now)

    asyncio.run(collect(1000.0))
    for _ in range(30):  # 30 requests held in 15 s
        c.priorities.add("critical")
    c.board.held_requests = 30
    signals = asyncio.run(collect(1015.0))
    assert signals.arrival_rate_per_s.value == 2.0 and signals.held_requests.value == 30
    c.board.held_requests = 0
    c.priorities.add("critical")
    assert asyncio.run(collect(1030.0)).arrival_rate_per_s is None


def test_a_follower_that_takes_the_lease_holds_the_leaders_replicas_for_a_window():
    """The leader scaled to 12 for a burst the follower did not see (it needs 2): on taking over, the follower
    keeps 12 for a stabilization window, as the leader would have, then scales down."""
    leading = {"now": False}
    c, cluster = controller(values={"arrival_rate_per_s": 8.0, "in_flight": 8.0, "queue_depth": 0.0,
                                    "service_time_s": 1.0}, replicas=12)
    c.is_leader = lambda: leading["now"]
    # constant traffic is steady, whose window is one lead time: the full stabilization window is tested here
    c.settings = settings("actuate", steady_burst_ratio=0.0)
    window_ticks = int(c.settings.policy.scale_down_stabilization_s / c.settings.tick_s)
    ticks(c, 2 * window_ticks)  # longer than a window: a first tick's hold has aged out
    assert cluster.replicas == 12 and c.scaler.calls == []  # a follower writes nothing
    leading["now"] = True
    taken_over = ticks(c, window_ticks - 1)
    assert all(d.replicas == 12 for d in taken_over) and cluster.replicas == 12
    later = ticks(c, 2)
    assert later[-1].replicas < 12 and cluster.replicas == later[-1].replicas  # nothing is held forever


def test_ticks_woken_by_each_held_request_read_the_rate_over_half_a_tick_at_least():
    """At zero the loop ticks at once on each held request. Counted since the tick before, one request a tenth
    of a second after it read 10 req/s where 2 arrive per second (the live wake of scale-to-zero read 48-86
    req/s at 25, and ordered 22-24 replicas where its twin ordered 12); over at least half a tick it reads the
    rate. Ticks on the period read one tick, as before, and a clock that steps back reads nothing."""
    from autoscaler.loop import PriorityCounter

    counted = PriorityCounter()
    assert counted.rates(1000.0, 7.5) == {}
    for _ in range(30):  # 30 requests in the 15-s tick
        counted.add("critical")
    assert counted.rates(1015.0, 7.5) == {"critical": 2.0}
    woken = []
    for k in range(1, 6):  # then a tick at each of five requests, 0.1 s apart
        counted.add("critical")
        woken.append(counted.rates(1015.0 + 0.1 * k, 7.5)["critical"])
    assert woken == [pytest.approx((30 + k) / (15 + 0.1 * k)) for k in range(1, 6)]  # since 1000: about 2
    assert PriorityCounter(counts={"critical": 1}).rates(5.0) == {}
    again = PriorityCounter()
    again.rates(1000.0, 7.5)
    again.add("standard")
    assert again.rates(999.0, 7.5) == {} and again.rates(1014.0, 7.5) == {"standard": 0.0}
    started = PriorityCounter()  # just after a start, before any reading is half a tick old
    started.rates(2000.0, 7.5)
    started.add("critical")
    assert started.rates(2000.05, 7.5) == {"critical": pytest.approx(1 / 7.5)}  # not 1 / 0.05 = 20 req/s
