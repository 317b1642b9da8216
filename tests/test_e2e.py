"""The closed loop under live load, the doubling drill (`python -m loadtest.e2e --scenario doubling`): real
requests through nginx into a fleet of fake vLLM servers whose number follows `autoscaler run`'s decisions
on a real control plane with Karpenter. Minutes at the default time compression; `make e2e` runs every
scenario."""

import json

from loadtest.e2e.run import run_scenario


def test_doubling_drill_passes_and_the_simulator_predicts_it(tmp_path):
    doc = run_scenario("doubling", factor=10.0, out=tmp_path)
    failed = [c for c in doc["checks"] if not c["passed"]]
    assert not failed, json.dumps(failed, indent=1) + f"\n(run folder: {tmp_path})"
    assert (tmp_path / "doubling.png").stat().st_size > 10_000
