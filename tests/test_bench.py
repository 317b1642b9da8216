"""The benchmark on the bundled trace: its JSON contract, and the targets it must show."""

import json

import pytest

from loadtest.bench import main

from helpers import BUNDLED_TRACE

KEYS = {"policy", "slo_attainment", "p99_queue_wait_s", "gpu_hours", "gpu_hours_vs_clairvoyant", "shed_fraction",
        "scaling_actions", "wall_s"}


@pytest.fixture(scope="module")
def rows(capsys_module=None):
    import io
    import contextlib

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["--trace", str(BUNDLED_TRACE), "--json"]) == 0
    return {row["policy"]: row for row in json.loads(buffer.getvalue())}


def test_json_has_every_policy_and_key(rows):
    assert set(rows) == {"predictive", "hpa", "kpa", "keda", "static", "clairvoyant"}
    for row in rows.values():
        assert KEYS <= set(row)
        assert set(row["slo_attainment"]) == {"critical", "standard", "sheddable"}
    assert rows["clairvoyant"]["gpu_hours_vs_clairvoyant"] == 1.0


def test_predictive_meets_the_targets_on_the_bundled_trace(rows):
    ours = rows["predictive"]
    assert ours["slo_attainment"]["critical"] >= 0.999
    assert ours["slo_attainment"]["standard"] >= 0.99
    assert ours["shed_by_class"]["sheddable"] <= 0.05
    assert ours["gpu_hours_vs_clairvoyant"] <= 1.25
    for name in ("hpa", "kpa", "keda", "static"):
        other = rows[name]
        if all(other["slo_attainment"][c] >= ours["slo_attainment"][c] for c in ("critical", "standard")):
            assert ours["gpu_hours"] < other["gpu_hours"], name


def test_bad_trace_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "x.csv"
    bad.write_text("nope\n")
    assert main(["--trace", str(bad)]) == 2
    assert "x.csv:1: header" in capsys.readouterr().err
