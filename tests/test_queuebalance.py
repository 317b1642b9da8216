"""`python -m loadtest.queuebalance`: a pooled queue is M/M/c; least connections over per-server queues
makes a critical request wait where one pooled queue would not."""

import pytest

from loadtest import queuebalance
from policies.queueing import erlang_c

MIX = dict(zip(queuebalance.CLASSES, queuebalance.MIX))


def _overall(shares: dict[str, float]) -> float:
    return sum(MIX[c] * shares[c] for c in shares)


@pytest.mark.parametrize("rate", [20.0, 26.0])
def test_one_pooled_queue_waits_as_erlang_c_says(rate):
    """Whatever the order a queue is served in, an arrival waits when it finds every slot busy: the share
    that waited at all (wait > 0) is Erlang C's C(c, a) for exponential service."""
    shares = queuebalance.late_shares(rate_per_s=rate, servers=1, slots=32, service_s=1.0, slo_s=0.0,
                                      requests=60_000, seed=3, exponential=True)
    assert _overall(shares) == pytest.approx(erlang_c(32, rate * 1.0), rel=0.15, abs=0.002)


def test_least_connections_makes_critical_wait_where_one_queue_would_not():
    """The fleet drill's chat near twice its base rate (four 8-slot replicas, ~10-s requests at factor 10,
    a 2-s SLO): with one queue, critical first, critical almost never waits past the SLO; behind least
    connections a critical request queued at one server waits for that server's slots."""
    common = dict(rate_per_s=22.0, service_s=1.0, slo_s=0.2, requests=60_000, seed=1)
    pooled = queuebalance.late_shares(servers=1, slots=32, **common)
    split = queuebalance.late_shares(servers=4, slots=8, **common)
    assert pooled["critical"] < 0.0005 < 0.002 < split["critical"]
    assert split["critical"] > 10 * max(pooled["critical"], 1e-5)


def test_the_command_prints_a_row_per_rate_and_rejects_bad_rates(capsys):
    assert queuebalance.main(["--rates", "18,22", "--requests", "5000"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("late share (wait > 0.2 s) by class: one queue of 32 slots")
    assert [line.split(" req/s")[0] for line in out[1:]] == ["18", "22"]
    with pytest.raises(SystemExit) as exc:
        queuebalance.main(["--rates", "20,-1"])
    assert exc.value.code == 2
    assert "rates must be positive" in capsys.readouterr().err


def test_slots_kept_for_the_top_class_cut_its_late_share_and_reject_the_lower_classes():
    """Trunk reservation behind least connections: one slot kept for critical makes far fewer critical
    requests wait past the SLO, and the lower classes pay in rejections, where one pooled queue rejects no one
    and makes critical wait less still."""
    common = dict(rate_per_s=22.0, servers=4, slots=8, service_s=1.0, slo_s=0.2, requests=60_000, seed=1)
    late, rejected = queuebalance.outcomes(**common)
    kept_late, kept_rejected = queuebalance.outcomes(reserve=1, **common)
    assert late == queuebalance.late_shares(**common) and set(rejected.values()) == {0.0}
    assert kept_late["critical"] < late["critical"] / 3
    assert kept_rejected["critical"] == 0.0
    assert min(kept_rejected["standard"], kept_rejected["sheddable"]) > 0.005
    pooled = queuebalance.late_shares(**{**common, "servers": 1, "slots": 32})
    assert pooled["critical"] < kept_late["critical"]


def test_the_command_prints_the_reserve_column_and_refuses_a_reserve_of_every_slot(capsys):
    assert queuebalance.main(["--rates", "22", "--requests", "5000", "--reserve", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("the same keeping 2 slots for critical: late / rejected")
    assert out[1].count("|") == 1 and out[1].split("|")[1].count("/") == 3
    with pytest.raises(SystemExit) as exc:
        queuebalance.main(["--reserve", "32"])
    assert exc.value.code == 2
    assert "leaves no slot of 32" in capsys.readouterr().err
