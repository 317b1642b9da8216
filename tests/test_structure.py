"""The shell's structure as a user meets it: `run` loads no simulator, one error family reaches the CLI,
one time parser, one clock that tests advance."""

import asyncio
import subprocess
import sys
from datetime import datetime, timezone

import pytest

from autoscaler.cli import main
from autoscaler.clock import ManualClock, SystemClock
from autoscaler.times import parse_time

from helpers import ROOT

OFFLINE_ONLY = ("autoscaler.sim", "autoscaler.traces", "autoscaler.replay", "autoscaler.analyze", "autoscaler.timeline",
                "matplotlib", "tqdm")
# The forecasting stack, 91 MB of a process's resident memory (docs/speed.md): imported by a statsmodels refit,
# never at start; `autoscaler run` refits in a child process, so never at all (tests/test_fitchild.py).
# numba (the replay extra) compiles the refits' grid search: at the first refit in a replay, never in `run`.
AT_FIRST_REFIT = ("statsmodels", "pandas", "patsy", "scipy.optimize", "scipy.stats", "numba", "llvmlite")


def test_the_run_command_loads_neither_the_simulator_nor_plotting_nor_the_forecasting_stack():
    """`autoscaler run` through the CLI, up to the point where its config is read (and found missing):
    everything the command imports is loaded by then; nothing of replay is, nor statsmodels before a refit."""
    probe = (
        "import sys\n"
        "from autoscaler.cli import main\n"
        "status = main(['run', '--config', '/nonexistent/config.yaml'])\n"
        "assert 'autoscaler.runtime' in sys.modules, 'the run path was not taken'\n"
        f"print(status, sorted(m for m in sys.modules if m.startswith({OFFLINE_ONLY + AT_FIRST_REFIT!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split(" ", 1) == ["2", "[]\n"], out.stdout + out.stderr
    replay = probe.replace("['run', '--config', '/nonexistent/config.yaml']", "['replay', '/nonexistent.csv']")
    replay = replay.replace("'autoscaler.runtime' in sys.modules", "'autoscaler.replay.command' in sys.modules")
    out = subprocess.run([sys.executable, "-c", replay], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "autoscaler.replay" in out.stdout  # the check sees the modules when they are loaded


def test_record_with_the_end_before_the_start_is_a_clear_error(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text("target: {namespace: llm, name: m}\nprometheus: {url: 'http://127.0.0.1:9'}\n")
    args = ["record", "--config", str(config), "--out", str(tmp_path / "rec.json")]
    assert main(args + ["--start", "now", "--end", "now-1h"]) == 2
    assert "--end" in capsys.readouterr().err
    assert main(args + ["--start", "yesterday"]) == 2
    assert "--start: 'yesterday': expected unix seconds or ISO 8601, now or now-<N>[smhd]" in capsys.readouterr().err
    assert main(args + ["--start", "now-1h"]) == 1  # a valid range; Prometheus is not there: an edge error
    assert "error:" in capsys.readouterr().err


def test_one_time_parser():
    now = 1_700_000_000.0
    assert parse_time(12) == 12.0 and parse_time(" 12.5 ") == 12.5
    assert parse_time("2023-11-14T22:13:20Z") == now
    assert parse_time("2023-11-14T23:13:20+01:00") == now
    assert parse_time("2023-11-14 22:13:20") == now  # no offset: UTC
    assert parse_time(datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc)) == now
    assert parse_time("now", now=now) == now and parse_time("now-2h", now=now) == now - 7200
    assert parse_time("now-1.5d", now=now) == now - 1.5 * 86400
    for bad in ("now", "now-2x", "tuesday", float("nan"), True, None):
        with pytest.raises(ValueError):
            parse_time(bad)  # relative forms only where the caller gives `now`
    with pytest.raises(ValueError, match="now-<N>"):
        parse_time("now+1h", now=now)


def test_manual_clock_wakes_sleepers_in_order_and_waits_end_on_their_event():
    async def go():
        clock, woke = ManualClock(10.0), []

        async def sleeper(name, seconds):
            await clock.sleep(seconds)
            woke.append((name, clock.now()))

        tasks = [asyncio.create_task(sleeper("b", 5.0)), asyncio.create_task(sleeper("a", 2.0))]
        await clock.advance(1.0)
        early = list(woke)
        await clock.advance(10.0)
        stop = asyncio.Event()
        waiter = asyncio.create_task(clock.wait(stop, 100.0))
        await clock.advance(50.0)
        pending = waiter.done()
        stop.set()
        await asyncio.gather(*tasks)
        return early, woke, pending, await waiter, clock.now()

    early, woke, pending, was_set, now = asyncio.run(go())
    assert early == [] and woke == [("a", 12.0), ("b", 15.0)]
    assert not pending and was_set and now == 71.0


def test_the_system_clock_is_unix_time_and_does_not_go_back():
    clock = SystemClock()
    readings = [clock.now() for _ in range(1000)]
    assert readings == sorted(readings)
    assert abs(readings[0] - datetime.now(timezone.utc).timestamp()) < 1.0
