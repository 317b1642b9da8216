"""The forecaster's statsmodels refits in a child process, so the controller never imports statsmodels.

Why: statsmodels and what it imports (pandas, scipy.optimize, scipy.stats, patsy) add about 91 MB to a
process (docs/speed.md), for a fit that runs every `refit_interval_s` (6 h by default) per model. The
controller passes a `ProcessFitter` to `decide` (`policies.stages.forecast.Fitter`); replays, benches and
tests keep fitting in their own process.

Design:
- One child, `python -P -m autoscaler.fitchild`, started at the first refit and reused for every refit that
  follows while it is busy (a fleet's models refit in the same tick: the child's imports are paid once
  per batch); it exits after `idle_s` without a fit, so its memory is held only while it fits. Requests
  are serialised under a lock: one fit at a time, in the caller's thread (decide runs in a worker thread,
  so the event loop keeps answering while a fit runs).
- Same bits, same code: the child runs `forecast.in_process` on the same bytes and sends back its result
  pickled: the same floats, bit for bit, as a fit in this process (tests/test_fitchild.py). It runs
  statsmodels' own grid search for the starting values even where numba is installed (the same choice,
  policies/stages/gridstart.py): compiling the faster one costs about a second of a short-lived child. `-P` and the
  parent's package root first on its PYTHONPATH: a controller started in a directory holding another
  checkout still runs its own code in the child. The child runs one BLAS thread unless the controller's
  environment names a thread count (`autoscaler.blas`): its fits are tiny, more threads only spin.
- Requests go on the child's stdin, answers on a pipe of their own (its fd the child's last argument); the
  child's stdout is our stderr, so nothing printed (a sitecustomize, an instrumentation, a library) is read
  as an answer. An answer is read with a size cap and checked for its shape.
- Every wait is bounded. A call waits at most `lock_wait_s` for another model's fit, then raises
  `FitUnavailable(BUSY)`: not a failure, no back-off, the refit stays due for a later tick. A watchdog kills
  the child at `timeout_s` (the controller's is half the tick's deadline), which unblocks a send to a child
  that reads nothing as well as a receive.
- Failure safety: a child that cannot start, exits (crash, OOM kill), does not answer within `timeout_s`
  or answers garbage is killed and raises `FitUnavailable` with the reason (kind start / exited / timeout /
  protocol): the policy keeps the previous parameters and names the reason in its decisions (a stable text:
  the back-off's countdown goes to the log). The failure is counted
  (`autoscaler_refit_failures_total{reason}`) and logged. For `backoff_s` after such a failure every call
  raises at once, so a broken child costs one timeout per `backoff_s`, not one per tick; the next call after
  that starts a fresh child. A fit that raises inside the child is answered `("error", repr)`: that call
  raises (counted as "error"), the child stays, no back-off. A child that died while idle is replaced
  before use, not counted.
- The child runs in its own session (a Ctrl-C or a group SIGTERM to the controller does not kill it
  mid-fit; `close` does) and sets its own oom_score_adj to 1000, so the OOM killer picks it first.
- `close` (shutdown) kills the child without waiting for a fit in progress; every later call raises
  `FitUnavailable(SHUTTING_DOWN)`, uncounted, and starts nothing.
- The child's peak resident memory (its own ru_maxrss, sent with every answer) is kept in `peak_rss_mb`.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Sequence

import structlog
from prometheus_client import CollectorRegistry, Counter

from autoscaler.blas import capped
from policies.stages.forecast import FitUnavailable

log = structlog.get_logger("autoscaler")

# A fit on a week of 5-min buckets takes about 0.2 s, the child's imports about 1.5 s (docs/speed.md); a
# loaded node may take several times that. The controller derives its timeout from the tick's deadline
# (`Parts.fitter`): half of it, so that a hung child leaves the tick time to publish and act; TIMEOUT_S is
# for a fitter made without one.
FIT_SHARE_OF_DEADLINE = 0.5
TIMEOUT_S = 30.0
IDLE_S = 60.0
BACKOFF_S = 300.0
# How long a call waits for another model's fit before it gives up for this tick (uncounted, no back-off).
LOCK_WAIT_S = 1.0
# An answer is a season of floats at most (a week of 60-s buckets: 10,080 floats, about 100 KB pickled);
# a length beyond this is a corrupted pipe, not an answer.
MAX_ANSWER_BYTES = 8 * 1024 * 1024
# `-P`: the cwd is not put first on the child's sys.path; the parent's package root goes first on its
# PYTHONPATH instead (`_child_env`), so the child runs the parent's code, not a checkout it was started in.
COMMAND = (sys.executable, "-P", "-m", "autoscaler.fitchild")
PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
BUSY = "the fit process is busy with other models' refits"
SHUTTING_DOWN = "shutting down"


class _Failure(Exception):
    """Why the child could not fit: `kind` (start, exited, timeout, protocol) labels the metric."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


class _FitError(Exception):
    """The child's fit raised: that request failed, the child is fine."""


def _child_env() -> dict[str, str]:
    env = capped(os.environ)  # one BLAS thread unless the user set a count: the fits are tiny (autoscaler.blas)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
    return env


class _Child:
    """A running child: requests on its stdin, answers on a pipe of their own (its fd number the last
    argument), its stdout sent to our stderr so that nothing printed reaches the answers."""

    def __init__(self, command: Sequence[str]) -> None:
        answers_r, answers_w = os.pipe()
        try:
            self.proc = subprocess.Popen([*command, str(answers_w)], stdin=subprocess.PIPE, stdout=2,
                                         pass_fds=(answers_w,), env=_child_env(), start_new_session=True)
        except OSError as exc:
            os.close(answers_r)
            raise _Failure("start", f"the fit process did not start: {exc}") from exc
        finally:
            os.close(answers_w)  # the child holds the only write end: its exit is our end of input
        assert self.proc.stdin is not None
        self.send = Connection(os.dup(self.proc.stdin.fileno()), readable=False)
        self.proc.stdin.close()
        self.recv = Connection(answers_r, writable=False)

    def ask(self, request: tuple[bytes, int, bool], timeout_s: float) -> Any:
        """The child's answer; `_Failure` when it exited, did not answer in time or answered garbage,
        `_FitError` when its fit raised. A watchdog kills the child at the deadline, which unblocks a send
        to a child that reads nothing as well as a receive."""
        fired = threading.Event()

        def kill() -> None:
            fired.set()
            self.proc.kill()

        watchdog = threading.Timer(timeout_s, kill)
        watchdog.daemon = True
        watchdog.start()
        try:
            self.send.send(request)
            answer = pickle.loads(self.recv.recv_bytes(MAX_ANSWER_BYTES))
        except Exception as exc:
            watchdog.cancel()
            raise self._failure(exc, fired=fired.is_set(), timeout_s=timeout_s) from exc
        watchdog.cancel()
        if fired.is_set():  # answered just as the watchdog killed it: the answer stands, the child is gone
            self.proc.wait()
        return _unpack(answer)

    def _failure(self, exc: Exception, *, fired: bool, timeout_s: float) -> _Failure:
        if fired:
            return _Failure("timeout", f"the fit process did not answer within {timeout_s:.0f} s")
        if isinstance(exc, (EOFError, ConnectionError)):
            try:  # the pipe closes as the child exits: wait for its exit code
                code: int | None = self.proc.wait(2.0)
            except subprocess.TimeoutExpired:
                code = None
            return _Failure("exited", f"the fit process exited (code {code})" if code is not None
                            else f"the fit process's pipe failed: {exc!r}")
        return _Failure("protocol", f"the fit process's answer was unreadable: {exc!r}")

    def stop(self, *, kill: bool = False) -> None:
        if kill:
            self.proc.kill()
        self.send.close()  # the child exits on end of input
        try:
            self.proc.wait(2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.recv.close()


def _unpack(answer: Any) -> tuple[Any, float]:
    """(fitted, the child's peak MB) from `("ok", fitted, peak_mb)`; `_FitError` for `("error", text)`."""
    if isinstance(answer, tuple) and len(answer) == 2 and answer[0] == "error":
        raise _FitError(str(answer[1]))
    if not (isinstance(answer, tuple) and len(answer) == 3 and answer[0] == "ok"
            and isinstance(answer[2], (int, float))):
        raise _Failure("protocol", f"the fit process's answer was malformed: {str(answer)[:100]!r}")
    return answer[1], float(answer[2])


class ProcessFitter:
    """A `forecast.Fitter` that runs the fit in a child process (see the module docstring). `now`: the
    controller's clock, which times the back-off; the timeout and the idle exit bound a real process, in
    real time."""

    def __init__(self, *, timeout_s: float = TIMEOUT_S, idle_s: float = IDLE_S, backoff_s: float = BACKOFF_S,
                 lock_wait_s: float = LOCK_WAIT_S, registry: CollectorRegistry | None = None,
                 command: Sequence[str] = COMMAND, now: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s, self.idle_s, self.backoff_s, self.command, self.now = timeout_s, idle_s, backoff_s, command, now
        self.lock_wait_s = lock_wait_s
        self.failures = Counter("autoscaler_refit_failures_total", "Due refits that could not run in the fit "
                                "process (previous parameters kept), by reason", ["reason"],
                                registry=registry if registry is not None else CollectorRegistry())
        self.peak_rss_mb: float | None = None
        self.fits = 0
        self._lock = threading.Lock()
        self._closed = False
        self._child: _Child | None = None
        self._failed_at: tuple[float, str] | None = None  # (time, reason) of the last failure
        self._used_s = 0.0  # time.monotonic() of the last answer: the idle exit's reference
        self._idle: threading.Timer | None = None  # one pending idle check at a time, however many fits

    def __call__(self, history: bytes, m: int, seasonal: bool) -> Any:
        if self._closed:
            raise FitUnavailable(SHUTTING_DOWN)
        # Bounded: a model never waits out another model's fit past its own tick; its refit stays due.
        if not self._lock.acquire(timeout=self.lock_wait_s):
            raise FitUnavailable(BUSY)
        try:
            return self._fit_locked(history, m, seasonal)
        finally:
            self._lock.release()

    def _fit_locked(self, history: bytes, m: int, seasonal: bool) -> Any:
        if self._closed:
            raise FitUnavailable(SHUTTING_DOWN)
        self._refuse_while_backing_off()
        try:
            fitted, peak_mb = self._ready_child().ask((history, m, seasonal), self.timeout_s)
        except _FitError as exc:  # that request's fit raised: the child serves the next one
            self.failures.labels("error").inc()
            log.warning("refit failed in the fit process", reason=str(exc), kind="error")
            raise FitUnavailable(f"the fit raised in the fit process: {exc}") from exc
        except _Failure as exc:
            if self._closed:  # killed by close(): not a failure; reaped here, where the pipes are owned
                self._drop_child(kill=True)
                raise FitUnavailable(SHUTTING_DOWN) from exc
            self._failed(exc)
            raise FitUnavailable(str(exc)) from exc
        self.fits += 1
        self.peak_rss_mb = max(self.peak_rss_mb or 0.0, peak_mb)
        self._used_s = time.monotonic()
        if self._closed:  # closed while this fit ran (close could not take the lock): the answer stands
            self._drop_child(kill=True)
        elif self._idle is None:
            self._check_idle_in(self.idle_s)
        return fitted

    def _ready_child(self) -> _Child:
        """The running child, or a fresh one: a child that died while idle (OOM kill, signal) is replaced,
        not a failure."""
        if self._child is not None and self._child.proc.poll() is not None:
            log.info("fit process had exited while idle; starting another", code=self._child.proc.returncode)
            self._drop_child()
        if self._child is None:
            self._child = _Child(self.command)
        return self._child

    def _check_idle_in(self, delay_s: float) -> None:
        self._idle = threading.Timer(delay_s, self._close_if_idle)
        self._idle.daemon = True  # never holds the interpreter's exit
        self._idle.start()

    def _refuse_while_backing_off(self) -> None:
        if self._failed_at is None:
            return
        at, reason = self._failed_at
        left_s = self.backoff_s - (self.now() - at)
        if left_s > 0:  # the reason alone: a decision's reasons stay the same from tick to tick
            log.debug("refit refused during the back-off", reason=reason, retry_in_s=round(left_s))
            raise FitUnavailable(reason)
        self._failed_at = None

    def _failed(self, exc: _Failure) -> None:
        self.failures.labels(exc.kind).inc()
        log.warning("refit failed", reason=str(exc), kind=exc.kind, retry_in_s=self.backoff_s)
        self._failed_at = (self.now(), str(exc))
        self._drop_child(kill=True)

    def _drop_child(self, *, kill: bool = False) -> None:
        if self._child is not None:
            self._child.stop(kill=kill)
            self._child = None

    def _close_if_idle(self) -> None:
        with self._lock:
            self._idle = None
            if self._child is None:
                return
            left_s = self.idle_s - (time.monotonic() - self._used_s)
            if left_s > 0:  # used since this check was set: check again when it has idled long enough
                self._check_idle_in(left_s)
                return
            self._drop_child()

    def close(self) -> None:
        """Stop for good (at shutdown): kill the child, even mid-fit, without waiting for that fit (the
        fitting thread then reaps it); every later call raises `FitUnavailable("shutting down")`."""
        self._closed = True
        idle, child = self._idle, self._child
        if idle is not None:
            idle.cancel()
        if child is not None:
            child.proc.kill()
        if self._lock.acquire(blocking=False):  # no fit in progress: reap the child here
            try:
                self._drop_child()
            finally:
                self._lock.release()


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KB on Linux


def _lowest_oom_priority() -> None:
    """The OOM killer picks this process before the controller (its memory is the fit's, and a killed child
    costs one refit, not the autoscaler)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """The child: fit each request from stdin, answer on the fd named by the last argument, until stdin ends.
    A fit that raises is answered `("error", repr)`: only that request fails."""
    os.dup2(2, 1)  # whatever a library prints goes to stderr, not into the answers
    _lowest_oom_priority()
    from policies.stages import gridstart
    from policies.stages.forecast import in_process

    gridstart.use_compiled(False)  # statsmodels' own grid search, the same bits: no compile in a short life

    requests = Connection(os.dup(0), writable=False)
    answers = Connection(int((argv if argv is not None else sys.argv)[-1]), readable=False)
    while True:
        try:
            history, m, seasonal = requests.recv()
        except EOFError:
            return 0
        try:
            answer: tuple = ("ok", in_process(history, m, seasonal), _peak_rss_mb())
        except Exception as exc:  # noqa: BLE001 - this request fails, the child serves the next
            answer = ("error", repr(exc))
        answers.send(answer)


if __name__ == "__main__":
    raise SystemExit(main())
