"""The memoised queueing solvers return what the same call computes afresh, whatever was asked before."""

import random

from policies.queueing import rate_within_slo, servers_for


def test_memoised_solvers_return_the_fresh_result_for_every_call():
    rng = random.Random(7)
    asked = [(rng.choice([0.0, 0.5, 3.0, 40.0, rng.uniform(0, 400)]), rng.choice([0.5, 2.0, rng.uniform(0.1, 30)]),
              rng.choice([2.0, 0.5]), rng.choice([0.001, 0.01, 0.5])) for _ in range(300)]
    for rate, service_s, wait_s, miss in asked + asked[::-1]:
        kwargs = {"service_s": service_s, "wait_s": wait_s, "miss_ratio": miss}
        assert servers_for(rate_per_s=rate, **kwargs) == servers_for.__wrapped__(rate_per_s=rate, **kwargs)
        servers = int(rate) + 1
        got = rate_within_slo(servers=servers, **kwargs)
        assert got.hex() == rate_within_slo.__wrapped__(servers=servers, **kwargs).hex()


def test_an_int_and_a_float_of_the_same_value_are_separate_entries():
    servers_for.cache_clear()
    servers_for(rate_per_s=10, service_s=1.0, wait_s=2.0, miss_ratio=0.01)
    servers_for(rate_per_s=10.0, service_s=1.0, wait_s=2.0, miss_ratio=0.01)
    assert servers_for.cache_info().currsize == 2
