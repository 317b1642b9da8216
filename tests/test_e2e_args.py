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
