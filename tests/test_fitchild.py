"""The refits in a child process (autoscaler/fitchild.py): the same bits as a fit in this process, and a child
that crashes, hangs or cannot start leaves the previous parameters in place, named, counted, never a scale-down."""

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from autoscaler.board import DecisionBoard
from autoscaler.fitchild import BUSY, SHUTTING_DOWN, ProcessFitter
from policies import decide, initial_state
from policies.stages import forecast
from policies.stages.demand import REFIT_REASON, UNFITTED_REASON
from policies.stages.forecast import FitUnavailable

from helpers import ROOT, signals


def _history(n: int) -> bytes:
    y = [50.0 + 20.0 * math.sin(2 * math.pi * i / 288) + 0.37 * (i % 7) + 0.01 * i for i in range(n)]
    return np.asarray(y, dtype=float).tobytes()


def _failures(fitter: ProcessFitter, reason: str) -> float:
    return fitter.failures.labels(reason)._value.get()


def _counted(fitter: ProcessFitter) -> float:
    return sum(_failures(fitter, r) for r in ("start", "exited", "timeout", "protocol", "error"))


# A child that answers every request `("ok", None, 1.0)` (no fit) on the fd its last argument names: for the
# tests of the process handling, without statsmodels' import.
_ANSWERS = ("import sys; from multiprocessing.connection import Connection; "
            "req = Connection(0, writable=False); ans = Connection(int(sys.argv[-1]), readable=False)\n"
            "while True:\n"
            "    try: req.recv()\n"
            "    except EOFError: break\n"
            "    ans.send(('ok', None, 1.0))\n")


def _within(limit_s: float, call):
    """`call()`'s result or exception, from a thread; fails the test (instead of hanging it) past `limit_s`."""
    out: list = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"still blocked after {limit_s} s"
    return out[0]


def test_a_fit_in_the_child_is_the_same_bits_as_in_this_process():
    fitter = ProcessFitter()
    try:
        for n, seasonal in ((40, False), (2 * 288 + 5, True)):
            fitted = fitter(_history(n), 288, seasonal)
            assert fitted is not None and fitted == forecast.in_process.__wrapped__(_history(n), 288, seasonal)
            if seasonal:
                assert len(fitted[6]) == 288
        assert fitter.fits == 2 and fitter.peak_rss_mb > 50  # the child's own peak, with statsmodels in it
    finally:
        fitter.close()


def test_decisions_with_the_fits_in_the_child_are_those_with_the_fits_in_process(spec):
    """100 minutes of a climbing, wavy demand: two refits (12 and 18 buckets), every decision and state equal."""
    fitter = ProcessFitter()
    try:
        ours, theirs = initial_state(), initial_state()
        for i in range(400):
            now = i * 15.0
            sig = signals(now, rate=30.0 + 0.02 * i + 5.0 * math.sin(i / 30.0), spec_replicas=8)
            d_child, ours = decide(spec, ours, sig, now, fit=fitter)
            d_here, theirs = decide(spec, theirs, sig, now)
            assert d_child == d_here and ours == theirs, now
        assert ours.forecast.kind == "holt" and fitter.fits == 2
    finally:
        fitter.close()


def test_a_child_that_crashes_is_a_named_failure_then_a_back_off_on_the_controllers_clock():
    crash = [sys.executable, "-c", "import sys; sys.stdin.buffer.read(1); raise SystemExit(3)"]
    clock_s = [1000.0]
    fitter = ProcessFitter(command=crash, backoff_s=60.0, now=lambda: clock_s[0])
    with pytest.raises(FitUnavailable, match=r"exited \(code 3\)"):
        fitter(_history(40), 288, False)
    assert _failures(fitter, "exited") == 1
    clock_s[0] += 59.0
    t0 = time.perf_counter()
    with pytest.raises(FitUnavailable, match=r"^the fit process exited \(code 3\)$"):  # no countdown: stable
        fitter(_history(40), 288, False)
    assert time.perf_counter() - t0 < 0.1 and _failures(fitter, "exited") == 1  # refused, no child started
    clock_s[0] += 1.0
    with pytest.raises(FitUnavailable, match=r"exited \(code 3\)$"):
        fitter(_history(40), 288, False)
    assert _failures(fitter, "exited") == 2  # the back-off over: a fresh child was tried


def test_a_child_that_hangs_is_killed_at_the_timeout():
    fitter = ProcessFitter(command=[sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=0.5)
    t0 = time.perf_counter()
    with pytest.raises(FitUnavailable, match="did not answer within 0 s|did not answer within 1 s"):
        fitter(_history(40), 288, False)
    assert time.perf_counter() - t0 < 5.0 and _failures(fitter, "timeout") == 1
    assert fitter._child is None  # killed and reaped


def test_a_child_that_cannot_start_is_a_named_failure_and_is_tried_again_after_the_back_off():
    fitter = ProcessFitter(command=["/nonexistent/python"], backoff_s=0.0)
    for attempt in (1, 2):
        with pytest.raises(FitUnavailable, match="did not start"):
            fitter(_history(40), 288, False)
        assert _failures(fitter, "start") == attempt and _failures(fitter, "exited") == 0


def test_an_idle_child_exits_and_the_next_fit_starts_another():
    fitter = ProcessFitter(idle_s=2.0)
    try:
        assert fitter(_history(40), 288, False) is not None
        first = fitter._child.proc
        time.sleep(0.5)
        assert fitter(_history(41), 288, False) is not None and fitter._child.proc is first  # in use: kept
        first.wait(10.0)  # idle for 2 s after its last fit: stopped
        assert fitter(_history(42), 288, False) is not None and fitter._child.proc is not first
        assert fitter.fits == 3
    finally:
        fitter.close()


def test_a_process_has_one_refit_child_and_its_failures_are_in_the_controllers_metrics():
    from prometheus_client import CollectorRegistry, generate_latest

    from autoscaler.clock import ManualClock
    from autoscaler.runtime import Parts

    parts, registry, clock = Parts(), CollectorRegistry(), ManualClock()
    fitter = parts.fitter(registry, clock, deadline_s=12.0)
    assert parts.fitter(registry, clock, deadline_s=12.0) is fitter  # the fleet's models share it
    fitter.command = ["/nonexistent/python"]
    with pytest.raises(FitUnavailable):
        fitter(_history(40), 288, False)
    assert b'autoscaler_refit_failures_total{reason="start"} 1.0' in generate_latest(registry)


def _unavailable(history: bytes, m: int, seasonal: bool):
    raise FitUnavailable("the fit process exited (code -9)")


def test_a_refit_that_cannot_run_keeps_the_previous_parameters_and_scales_nothing_down(spec):
    """Steady demand for 100 minutes: the first fit (12 buckets) runs in process; the next one (18 buckets) cannot
    run for one tick, then runs on the tick after."""
    state, failed_at = initial_state(), None
    for i in range(400):
        now = i * 15.0
        sig = signals(now, rate=40.0 + (i % 3), spec_replicas=8)
        reference, fitted = decide(spec, state, sig, now)  # the refit, if one is due, run in process
        d, after = reference, fitted
        if reference.refitted and state.forecast.kind == "holt" and failed_at is None:
            d, after = decide(spec, state, sig, now, fit=_unavailable)
            failed_at, kept = now, state.forecast
            assert after.forecast.unfitted == "the fit process exited (code -9)"
            assert (after.forecast.alpha, after.forecast.beta, after.forecast.phi, after.forecast.fitted_at_s) == (
                kept.alpha, kept.beta, kept.phi, kept.fitted_at_s)
            assert not d.refitted and any(r.startswith(UNFITTED_REASON) and "code -9" in r for r in d.reasons)
            assert d.valid and d.replicas >= reference.replicas >= 1
        elif failed_at is not None and now == failed_at + 15.0:
            assert after.forecast.unfitted is None and d.refitted  # still due: it ran on the next tick
            assert any(r.startswith(REFIT_REASON) for r in d.reasons)
            assert not any(r.startswith(UNFITTED_REASON) for r in d.reasons)
        state = after
    assert failed_at is not None


def test_the_controller_process_never_imports_statsmodels_when_fits_run_in_the_child():
    """A fresh process with `autoscaler run`'s imports runs a controller for 100 simulated minutes: its refits
    (12 and 18 buckets) ran in the child, and nothing of their stack was imported here."""
    out = subprocess.run([sys.executable, "-m", "loadtest.controllerday", "--ticks", "400"], cwd=ROOT,
                         capture_output=True, text=True, check=True, timeout=120)
    day = json.loads(out.stdout.strip().splitlines()[-1])
    assert day["child_fits"] == 2 and day["child_peak_mb"] > 50 and day["fit_stack_loaded"] == [], out.stdout
    out = subprocess.run([sys.executable, "-m", "loadtest.controllerday", "--ticks", "400", "--fit-in-process"],
                         cwd=ROOT, capture_output=True, text=True, check=True, timeout=120)
    assert "statsmodels" in json.loads(out.stdout.strip().splitlines()[-1])["fit_stack_loaded"]  # the check sees it


def test_a_child_that_does_not_read_a_request_larger_than_the_pipe_is_killed_at_the_timeout():
    """A week of 60-s buckets (80 KB) exceeds the pipe's buffer: the send itself blocks until the watchdog."""
    fitter = ProcessFitter(command=[sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=0.5)
    exc = _within(5.0, lambda: fitter(_history(7 * 1440), 1440, True))
    assert isinstance(exc, FitUnavailable) and "did not answer within" in str(exc)
    assert _failures(fitter, "timeout") == 1 and fitter._child is None


def test_text_a_child_prints_before_main_does_not_reach_the_answers():
    noisy = [sys.executable, "-c", "print('x' * 100, flush=True)\n" + _ANSWERS]
    fitter = ProcessFitter(command=noisy, timeout_s=5.0)
    try:
        assert _within(10.0, lambda: fitter(_history(40), 288, False)) is None and fitter.fits == 1
    finally:
        fitter.close()


@pytest.mark.parametrize("answer, why", [
    ("ans.send_bytes(b'not a pickle')", "unreadable"),  # an UnpicklingError, not out of decide
    ("import os; os.write(int(sys.argv[-1]), b'\\x7f\\xff\\xff\\xff')", "unreadable"),  # a 2-GB length
    ("ans.send(('ok', None))", "malformed"),
])
def test_a_garbled_answer_is_a_protocol_failure_and_the_child_is_killed(answer, why):
    script = ("import sys, time; from multiprocessing.connection import Connection; "
              "Connection(0, writable=False).recv(); ans = Connection(int(sys.argv[-1]), readable=False)\n"
              f"{answer}\ntime.sleep(60)")
    fitter = ProcessFitter(command=[sys.executable, "-c", script], timeout_s=5.0)
    exc = _within(10.0, lambda: fitter(_history(40), 288, False))
    assert isinstance(exc, FitUnavailable) and why in str(exc), exc
    assert _failures(fitter, "protocol") == 1 and fitter._child is None  # killed and reaped


def test_a_model_waiting_for_another_models_fit_gives_up_uncounted_and_without_back_off():
    fitter = ProcessFitter(command=[sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=3.0,
                           lock_wait_s=0.2)
    hung = threading.Thread(target=lambda: pytest.raises(FitUnavailable, fitter, _history(40), 288, False))
    hung.start()
    try:
        deadline = time.monotonic() + 5.0
        while fitter._child is None and time.monotonic() < deadline:  # the first call holds the child
            time.sleep(0.05)
        t0 = time.perf_counter()
        with pytest.raises(FitUnavailable, match=f"^{BUSY}$"):
            fitter(_history(41), 288, False)
        assert time.perf_counter() - t0 < 1.0 and _counted(fitter) == 0 and fitter._failed_at is None
    finally:
        hung.join(10.0)
    assert _failures(fitter, "timeout") == 1  # the hung one's


def test_a_child_that_died_while_idle_is_replaced_without_a_failure():
    fitter = ProcessFitter(command=[sys.executable, "-c", _ANSWERS], timeout_s=5.0)
    try:
        assert fitter(_history(40), 288, False) is None
        first = fitter._child.proc
        first.send_signal(signal.SIGKILL)  # as the OOM killer would
        first.wait(5.0)
        assert fitter(_history(41), 288, False) is None and fitter._child.proc is not first
        assert fitter.fits == 2 and _counted(fitter) == 0 and fitter._failed_at is None
    finally:
        fitter.close()


def test_close_kills_a_fit_in_progress_at_once_and_later_calls_start_no_child():
    fitter = ProcessFitter(command=[sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=30.0)
    outcome: list = []
    fitting = threading.Thread(target=lambda: outcome.append(_within(10.0, lambda: fitter(_history(40), 288, False))))
    fitting.start()
    deadline = time.monotonic() + 5.0
    while fitter._child is None and time.monotonic() < deadline:  # the fit has started its child
        time.sleep(0.05)
    proc = fitter._child.proc
    t0 = time.perf_counter()
    fitter.close()
    assert time.perf_counter() - t0 < 0.5  # did not wait for the fit's lock
    fitting.join(5.0)
    assert proc.poll() is not None and str(outcome[0]) == SHUTTING_DOWN and _counted(fitter) == 0
    with pytest.raises(FitUnavailable, match=f"^{SHUTTING_DOWN}$"):
        fitter(_history(40), 288, False)
    assert fitter._child is None and _counted(fitter) == 0


def test_the_child_runs_this_checkout_whatever_the_directory_it_is_started_in(tmp_path, monkeypatch):
    (tmp_path / "autoscaler").mkdir()
    (tmp_path / "autoscaler" / "__init__.py").write_text("")
    (tmp_path / "autoscaler" / "fitchild.py").write_text("raise SystemExit(7)\n")
    monkeypatch.chdir(tmp_path)
    fitter = ProcessFitter()
    try:
        assert fitter(_history(40), 288, False) == forecast.in_process.__wrapped__(_history(40), 288, False)
    finally:
        fitter.close()


def test_a_fit_that_raises_in_the_child_fails_that_call_only():
    """An odd number of bytes is no float64 history: the child's fit raises; the same child fits the next."""
    fitter = ProcessFitter()
    try:
        with pytest.raises(FitUnavailable, match="ValueError"):
            fitter(b"abc", 288, False)
        child = fitter._child.proc
        assert _failures(fitter, "error") == 1 and fitter._failed_at is None and child.poll() is None
        assert fitter(_history(40), 288, False) is not None and fitter._child.proc is child
        assert os.getsid(child.pid) != os.getsid(0)  # its own session: a Ctrl-C to ours does not stop a fit
        with open(f"/proc/{child.pid}/oom_score_adj") as f:
            assert f.read().strip() == "1000"  # the OOM killer picks it before the controller
    finally:
        fitter.close()


def _controller_settings():
    from autoscaler.config import Settings

    return Settings(target={"namespace": "llm", "name": "m"}, mode="shadow",
                    prometheus={"url": "http://127.0.0.1:9"}, leader_election={"enabled": False},
                    warm_pool={"enabled": False}, policy={"tick_s": 10})


def test_autoscaler_run_passes_its_refit_child_to_the_loop_with_half_the_ticks_deadline_and_closes_it():
    import asyncio

    from kubernetes_asyncio import client

    from autoscaler.clock import SystemClock
    from autoscaler.kube.client import Kube
    from autoscaler.loop import PriorityCounter
    from autoscaler.metrics import ControllerMetrics
    from autoscaler.runtime import Parts, build_controller, stop_servers

    settings, parts, metrics = _controller_settings(), Parts(), ControllerMetrics()

    async def go():
        kube = Kube(client.ApiClient())  # no request is made
        try:
            controller = build_controller(settings, kube, None, identity="test", board=DecisionBoard(),
                                          metrics=metrics, priorities=PriorityCounter(), clock=SystemClock(),
                                          parts=parts)
            assert isinstance(parts.fit, ProcessFitter) and controller.fit is parts.fit
            assert parts.fit.timeout_s == settings.deadline_s / 2 == 4.0  # 80 % of a 10-s tick, halved
            await stop_servers(parts)
        finally:
            await kube.close()

    asyncio.run(go())
    with pytest.raises(FitUnavailable, match=f"^{SHUTTING_DOWN}$"):  # closed by stop_servers
        parts.fit(_history(40), 288, False)


def test_the_fleet_passes_its_one_refit_child_to_every_model():
    import asyncio

    from kubernetes_asyncio import client

    from autoscaler.clock import SystemClock
    from autoscaler.config import Settings
    from autoscaler.crd import parse_spec, settings_for
    from autoscaler.fleet.runtime import base_config, build_fleet
    from autoscaler.kube.client import Kube
    from autoscaler.runtime import Parts

    settings = Settings(fleet={"enabled": True, "namespaces": ["llm"]}, mode="shadow",
                        prometheus={"url": "http://127.0.0.1:9"}, warm_pool={"enabled": False},
                        leader_election={"enabled": False}, policy={"tick_s": 5})

    def spec(target):
        return settings_for(namespace="llm", base=base_config(settings), spec=parse_spec(
            {"target": {"name": target}, "selector": {"matchLabels": {"app": target}}, "policy": {"tick_s": 5}}))

    async def go():
        kube, parts = Kube(client.ApiClient()), Parts()
        try:
            fleet = build_fleet(settings, kube, None, identity="test", clock=SystemClock(), parts=parts)
            assert isinstance(parts.fit, ProcessFitter) and parts.fit.timeout_s == settings.deadline_s / 2
            models = [fleet.builder.build(("llm", n), spec(n), generation=1, is_leader=lambda: True) for n in "ab"]
            assert [m.controller.fit for m in models] == [parts.fit, parts.fit]
            await fleet.builder.update(models[0], spec("other"), generation=2)  # a new target: a new controller
            assert models[0].controller.fit is parts.fit
            await asyncio.gather(*(m.stop() for m in models))
        finally:
            await kube.close()

    asyncio.run(go())
