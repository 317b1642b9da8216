"""The forecaster's statsmodels refits in a child process, so the controller never imports statsmodels.

Why: statsmodels and what it imports (pandas, scipy.optimize, scipy.stats, patsy) add about 91 MB to a
process (docs/speed.md), for a fit that runs every `refit_interval_s` (6 h by default) per model. The
controller passes a `ProcessFitter` to `decide` (`policies.stages.forecast.Fitter`); replays, benches and
tests keep fitting in their own process.

Design:
- One child, `python -m autoscaler.fitchild`, started at the first refit and reused for every refit that
  follows while it is busy (a fleet's models refit in the same tick: the child's imports are paid once
  per batch); it exits after `idle_s` without a fit, so its memory is held only while it fits. Requests
  are serialised under a lock: one fit at a time, in the caller's thread (decide runs in a worker thread,
  so the event loop keeps answering while a fit runs).
- The child runs `forecast.in_process` on the same bytes and sends back its result pickled: the same
  floats, bit for bit, as a fit in this process (tests/test_fitchild.py).
- Failure safety: a child that cannot start, exits (crash, OOM kill) or does not answer within `timeout_s`
  (killed) raises `FitUnavailable` with the reason: the policy keeps the previous parameters and names the
  reason in its decisions. The failure is counted (`autoscaler_refit_failures_total{reason}`) and logged.
  For `backoff_s` after a failure every call raises at once, so a broken child costs one timeout per
  `backoff_s`, not one per tick; the next call after that starts a fresh child.
- The child's peak resident memory (its own ru_maxrss, sent with every answer) is kept in `peak_rss_mb`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Callable, Sequence

import structlog
from prometheus_client import CollectorRegistry, Counter

from policies.stages.forecast import FitUnavailable

log = structlog.get_logger("autoscaler")

# A fit on a week of 5-min buckets takes about 0.2 s, the child's imports about 1.5 s (docs/speed.md); a
# loaded node may take several times that. The decide of the model that waits is late by at most this.
TIMEOUT_S = 30.0
IDLE_S = 60.0
BACKOFF_S = 300.0
COMMAND = (sys.executable, "-m", "autoscaler.fitchild")


class _Failure(Exception):
    """Why the child could not fit: `kind` (start, exited, timeout) labels the metric."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


class _Child:
    """A running child and the two ends of its pipe."""

    def __init__(self, command: Sequence[str]) -> None:
        try:
            self.proc = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        except OSError as exc:
            raise _Failure("start", f"the fit process did not start: {exc}") from exc
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.send = Connection(os.dup(self.proc.stdin.fileno()), readable=False)
        self.recv = Connection(os.dup(self.proc.stdout.fileno()), writable=False)
        self.proc.stdin.close()
        self.proc.stdout.close()

    def ask(self, request: tuple[bytes, int, bool], timeout_s: float) -> Any:
        """The child's answer; `_Failure` when it exited or did not answer in time."""
        try:
            self.send.send(request)
            if not self.recv.poll(timeout_s):
                raise _Failure("timeout", f"the fit process did not answer within {timeout_s:.0f} s")
            return self.recv.recv()
        except (EOFError, OSError) as exc:
            try:  # the pipe closes as the child exits: wait for its exit code
                code: int | None = self.proc.wait(2.0)
            except subprocess.TimeoutExpired:
                code = None
            raise _Failure("exited", f"the fit process exited (code {code})" if code is not None
                           else f"the fit process's pipe failed: {exc!r}") from exc

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


class ProcessFitter:
    """A `forecast.Fitter` that runs the fit in a child process (see the module docstring). `now`: the
    controller's clock, which times the back-off; the timeout and the idle exit bound a real process, in
    real time."""

    def __init__(self, *, timeout_s: float = TIMEOUT_S, idle_s: float = IDLE_S, backoff_s: float = BACKOFF_S,
                 registry: CollectorRegistry | None = None, command: Sequence[str] = COMMAND,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s, self.idle_s, self.backoff_s, self.command, self.now = timeout_s, idle_s, backoff_s, command, now
        self.failures = Counter("autoscaler_refit_failures_total", "Due refits that could not run in the fit "
                                "process (previous parameters kept), by reason", ["reason"],
                                registry=registry if registry is not None else CollectorRegistry())
        self.peak_rss_mb: float | None = None
        self.fits = 0
        self._lock = threading.Lock()
        self._child: _Child | None = None
        self._failed_at: tuple[float, str] | None = None  # (time, reason) of the last failure
        self._used_s = 0.0  # time.monotonic() of the last answer: the idle exit's reference
        self._idle: threading.Timer | None = None  # one pending idle check at a time, however many fits

    def __call__(self, history: bytes, m: int, seasonal: bool) -> Any:
        with self._lock:
            self._refuse_while_backing_off()
            try:
                if self._child is None:
                    self._child = _Child(self.command)
                fitted, peak_mb = self._child.ask((history, m, seasonal), self.timeout_s)
            except _Failure as exc:
                self._failed(exc)
                raise FitUnavailable(str(exc)) from exc
            self.fits += 1
            self.peak_rss_mb = max(self.peak_rss_mb or 0.0, peak_mb)
            self._used_s = time.monotonic()
            if self._idle is None:
                self._check_idle_in(self.idle_s)
            return fitted

    def _check_idle_in(self, delay_s: float) -> None:
        self._idle = threading.Timer(delay_s, self._close_if_idle)
        self._idle.daemon = True  # never holds the interpreter's exit
        self._idle.start()

    def _refuse_while_backing_off(self) -> None:
        if self._failed_at is None:
            return
        at, reason = self._failed_at
        left_s = self.backoff_s - (self.now() - at)
        if left_s > 0:
            raise FitUnavailable(f"{reason}; next attempt in {left_s:.0f} s")
        self._failed_at = None

    def _failed(self, exc: _Failure) -> None:
        self.failures.labels(exc.kind).inc()
        log.warning("refit failed", reason=str(exc), kind=exc.kind, retry_in_s=self.backoff_s)
        self._failed_at = (self.now(), str(exc))
        if self._child is not None:
            self._child.stop(kill=True)
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
            self._child.stop()
            self._child = None

    def close(self) -> None:
        """Stop the child (at shutdown); the next fit starts a new one."""
        with self._lock:
            if self._idle is not None:
                self._idle.cancel()
                self._idle = None
            if self._child is not None:
                self._child.stop()
                self._child = None


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KB on Linux


def main() -> int:
    """The child: fit each request from stdin, answer on stdout, until stdin ends."""
    from policies.stages.forecast import in_process

    requests = Connection(os.dup(0), writable=False)
    answers = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)  # whatever a library prints goes to stderr, not into the answers
    while True:
        try:
            history, m, seasonal = requests.recv()
        except EOFError:
            return 0
        answers.send((in_process(history, m, seasonal), _peak_rss_mb()))


if __name__ == "__main__":
    raise SystemExit(main())
