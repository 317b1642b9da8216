"""`python -m loadtest.decide_bench` on the bundled trace: both clocks and the replay ratio are printed."""

import re

from loadtest import decide_bench


def test_decide_bench_prints_wall_and_cpu_figures(capsys):
    assert decide_bench.main([]) == 0
    out = capsys.readouterr().out
    assert re.search(r"trace azure-llm-2023-code: 230 ticks", out), out
    assert re.search(r"wall median [\d.]+ ms, p99 [\d.]+ ms; thread CPU median [\d.]+ ms, p99 [\d.]+ ms", out), out
    assert re.search(r"predictive / clairvoyant [\d.]+x wall, [\d.]+x CPU", out), out


def test_decide_bench_rejects_a_missing_trace(capsys, tmp_path):
    assert decide_bench.main(["--trace", str(tmp_path / "none.csv")]) == 2
    assert "error:" in capsys.readouterr().err


def test_bench_prints_the_median_and_p99_of_decide(capsys):
    from loadtest import bench

    assert bench.main(["--policies", "predictive"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"predictive decide\(\): median [\d.]+ ms, p99 [\d.]+ ms \(scheduled refits included\) over 230 "
                     r"ticks; median excluding 0 scheduled refits [\d.]+ ms", out), out
