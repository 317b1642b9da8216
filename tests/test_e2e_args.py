"""`python -m loadtest.e2e --out DIR` with a relative DIR: every path handed on is absolute, since nginx
(started with its own prefix) would resolve a relative one against that prefix. Runs no scenario."""

import pytest

import loadtest.e2e.__main__ as e2e_main


class _Captured(Exception):
    pass


@pytest.mark.parametrize("argv", [["--out", "e2e-out"], ["--out", "./a/../e2e-out"], []])
def test_a_relative_out_reaches_the_scenario_as_an_absolute_folder(argv, tmp_path, monkeypatch):
    seen = []

    def fake_run(name, *, factor, out):
        seen.append(out)
        raise _Captured

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(e2e_main, "run_scenario", fake_run)
    with pytest.raises(_Captured):
        e2e_main.main(["--scenario", "doubling", *argv])
    assert seen[0].is_absolute()
    assert seen[0] == tmp_path / "e2e-out" / "doubling"


def _fake_runs(verdicts):
    """A stand-in for run_scenario that returns the given verdicts in turn, recording each run's folder."""
    seen = []

    def fake_run(name, *, factor, out):
        passed = verdicts[len(seen)]
        seen.append(out)
        if passed is None:
            raise TimeoutError("the stack did not come up")
        return {"scenario": name, "factor": factor, "requests": 1, "lost_requests": 0, "gpu_hours": 1.0,
                "slo_attainment": {}, "shed_fraction": {}, "p99_latency_s": {},
                "simulated": {"gpu_hours": 1.0, "slo_attainment": {}, "shed_fraction": {}},
                "checks": [{"check": "c", "passed": passed, "detail": "d"}], "passed": passed}

    return fake_run, seen


def test_repeat_runs_every_run_into_its_own_folder_and_counts_them_all(tmp_path, monkeypatch, capsys):
    fake_run, seen = _fake_runs([True, True, False, True])
    monkeypatch.setattr(e2e_main, "run_scenario", fake_run)
    code = e2e_main.main(["--scenario", "doubling", "--out", str(tmp_path), "--repeat", "4"])
    assert code == 1  # one run failed: the drill did not pass 4 of 4
    assert seen == [tmp_path / "doubling" / f"run-{k}" for k in range(1, 5)]
    out = capsys.readouterr().out
    assert "run 3 of 4: FAILED" in out
    assert "doubling: 3 of 4 runs passed every check; the first 2 in a row" in out


def test_repeat_passes_only_when_every_run_passes(tmp_path, monkeypatch, capsys):
    fake_run, _ = _fake_runs([True, True])
    monkeypatch.setattr(e2e_main, "run_scenario", fake_run)
    assert e2e_main.main(["--scenario", "doubling", "--out", str(tmp_path), "--repeat", "2"]) == 0
    assert "doubling: 2 of 2 runs passed every check; the first 2 in a row" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--repeat", "0"], ["--repeat", "2", "--json"], ["--repeat", "x"]])
def test_repeat_refuses_what_it_cannot_do(argv, monkeypatch):
    monkeypatch.setattr(e2e_main, "run_scenario", lambda *a, **k: pytest.fail("ran a scenario"))
    with pytest.raises(SystemExit) as exc:
        e2e_main.main(["--scenario", "doubling", *argv])
    assert exc.value.code == 2


def test_repeat_counts_a_run_that_breaks_as_failed_and_goes_on(tmp_path, monkeypatch, capsys):
    fake_run, seen = _fake_runs([True, None, True])
    monkeypatch.setattr(e2e_main, "run_scenario", fake_run)
    assert e2e_main.main(["--scenario", "doubling", "--out", str(tmp_path), "--repeat", "3"]) == 1
    assert len(seen) == 3
    out = capsys.readouterr().out
    assert "run 2 of 3: FAILED, it did not complete: TimeoutError: the stack did not come up" in out
    assert "doubling: 2 of 3 runs passed every check; the first 1 in a row" in out
