"""One BLAS thread in the refit child and in the harness's processes, unless the user set a thread count
(autoscaler/blas.py): seen from outside, in each real process's environment and thread count after BLAS calls
in both numpy's and scipy's OpenBLAS."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from autoscaler.blas import THREAD_VARS, capped
from autoscaler.fitchild import ProcessFitter

from helpers import ROOT

# OpenBLAS runs no more threads than the cores this process may use: a user's 2 threads in each of the two
# copies show as the main thread and one more in each on 2 cores or more, as the main thread alone on one.
_USER_TWO_THREADS = 1 + 2 * (min(2, len(os.sched_getaffinity(0))) - 1)

# A process of the harness: both OpenBLAS copies (numpy's and scipy's) loaded and used on matrices large
# enough for threads, in the main process and in the frontier's worker processes (the sweep's points replaced
# by a probe); prints each process's thread count (its BLAS threads and the main thread) and variables.
_HARNESS = """
import json, os, types
import loadtest.frontier as frontier
import numpy as np, scipy.linalg.blas as sb

def used():
    a = np.ones((300, 300))
    a @ a
    sb.dgemm(1.0, a, a)
    threads = int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("Threads:")))
    return {"threads": threads, "env": {v: os.environ.get(v) for v in %r}}

def probe(task):
    return used()

frontier._point = probe
rows = frontier.sweep(types.SimpleNamespace(workers=2), types.SimpleNamespace(needed=None), ("one", "two"))
print(json.dumps({"main": used()["threads"], "workers": [r[0] for r in rows.values()]}))
""" % (THREAD_VARS,)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env["PYTHONPATH"] = str(ROOT)
    return {**env, **extra}


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("Threads:")))


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = (item.decode().partition("=") for item in f.read().split(b"\0") if item)
        return {k: v for k, _, v in pairs}


def _history() -> bytes:
    return np.asarray([50.0 + 20.0 * math.sin(2 * math.pi * i / 288) + 0.01 * i for i in range(2 * 288 + 5)],
                      dtype=float).tobytes()


def test_no_thread_count_set_gives_one_thread_for_every_library():
    env = capped({"PATH": "/bin", "OMP_NUM_THREADS": ""})  # empty is unset, as OpenBLAS reads it
    assert env == {"PATH": "/bin", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.mark.parametrize("name", THREAD_VARS)
def test_a_thread_count_the_user_set_wins_and_nothing_else_is_added(name):
    # OpenBLAS falls back to OMP_NUM_THREADS: adding OPENBLAS_NUM_THREADS=1 beside a user's OMP value would
    # override it.
    assert capped({"PATH": "/bin", name: "4"}) == {"PATH": "/bin", name: "4"}


def test_the_harness_and_its_frontier_workers_run_one_blas_thread():
    out = subprocess.run([sys.executable, "-c", _HARNESS], env=_clean_env(), capture_output=True, text=True,
                         timeout=120, check=True)
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["main"] == 1
    assert [w["threads"] for w in seen["workers"]] == [1, 1]
    assert all(w["env"] == dict.fromkeys(THREAD_VARS, "1") for w in seen["workers"])


def test_the_harness_keeps_a_thread_count_the_user_set():
    out = subprocess.run([sys.executable, "-c", _HARNESS], env=_clean_env(OPENBLAS_NUM_THREADS="2"),
                         capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["main"] == _USER_TWO_THREADS
    assert all(w["threads"] == _USER_TWO_THREADS for w in seen["workers"])
    assert all(w["env"] == {"OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": None, "MKL_NUM_THREADS": None}
               for w in seen["workers"])


@pytest.mark.parametrize("user, threads", [({}, 1), ({"OPENBLAS_NUM_THREADS": "2"}, _USER_TWO_THREADS)])
def test_the_refit_child_runs_one_blas_thread_unless_the_user_set_a_count(monkeypatch, user, threads):
    for name in THREAD_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in user.items():
        monkeypatch.setenv(name, value)
    fitter = ProcessFitter(timeout_s=60.0)
    try:
        assert fitter(_history(), 288, True) is not None  # a seasonal fit: statsmodels, scipy and numpy loaded
        child = fitter._child
        assert child is not None
        environ = _environ(child.proc.pid)
        assert {k: environ.get(k) for k in THREAD_VARS} == (
            {k: user.get(k) for k in THREAD_VARS} if user else dict.fromkeys(THREAD_VARS, "1"))
        assert _threads(child.proc.pid) == threads
    finally:
        fitter.close()


# `autoscaler replay` with the replay itself replaced by a probe that loads and uses both OpenBLAS copies:
# whatever the command imports before the replay runs, the cap must come before numpy.
_REPLAY = """
import json, sys, types
from autoscaler import cli

def probe(args):
    import numpy as np, scipy.linalg.blas as sb
    a = np.ones((300, 300))
    a @ a
    sb.dgemm(1.0, a, a)
    print(json.dumps(int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("Threads:")))))
    return 0

sys.modules["autoscaler.replay.command"] = types.SimpleNamespace(replay=probe)
sys.exit(cli.main(["replay", "recording.json"]))
"""


@pytest.mark.parametrize("user, threads", [({}, 1), ({"OPENBLAS_NUM_THREADS": "2"}, _USER_TWO_THREADS)])
def test_autoscaler_replay_runs_its_fits_on_one_blas_thread_unless_the_user_set_a_count(user, threads):
    out = subprocess.run([sys.executable, "-c", _REPLAY], env=_clean_env(**user), capture_output=True, text=True,
                         timeout=60, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == threads


_CONTROLLER_ENV = """
import json, pathlib
import loadtest.e2e.stack as stack
from autoscaler.blas import THREAD_VARS
seen = {}
class Popen:
    def __init__(self, argv, **kw):
        seen.update({k: kw["env"].get(k) for k in THREAD_VARS})
stack.subprocess.Popen = Popen
log = pathlib.Path("/dev/null")
stack.ControllerProcess("c", config_file="c.yaml", http_port=1, admission_port=2, log=log).start("k")
print(json.dumps(seen))
"""


@pytest.mark.parametrize("user, expected", [({}, dict.fromkeys(THREAD_VARS)),
                                             ({"OMP_NUM_THREADS": "3"}, {**dict.fromkeys(THREAD_VARS),
                                                                          "OMP_NUM_THREADS": "3"})])
def test_the_controller_the_harness_starts_runs_as_shipped_not_capped(user, expected):
    """The harness caps its own process on import; the `autoscaler run` it starts gets the environment
    without what the cap added (a Deployment sets no thread count), and a user's own setting unchanged."""
    out = subprocess.run([sys.executable, "-c", _CONTROLLER_ENV], env=_clean_env(**user), capture_output=True,
                         text=True, timeout=120, check=True, cwd=ROOT)
    assert json.loads(out.stdout.splitlines()[-1]) == expected
