"""One BLAS thread where the linear algebra is small: the refit child, `autoscaler replay`, the harness.

Why: numpy and scipy each load their own OpenBLAS, which by default runs a worker thread per core. The
forecaster's statsmodels fits are tiny (a week of buckets, a handful of parameters): on a 2-core machine the
extra threads make no fit faster and spend about 4 s of CPU in a 14-day replay (docs/speed.md), and a
frontier's workers, one per core, each with a thread per core, oversubscribe the cores.

Design:
- The cap is the libraries' own environment variables, which each library reads once, when it loads. Set
  before numpy's first import they cover every library loaded after it too (scipy's OpenBLAS loads with
  statsmodels, at the first fit), and a child process or a forked worker inherits them. A runtime limit
  (threadpoolctl) reaches only the libraries already loaded, so it would have to wrap every fit.
- The user's value wins: when any of the variables is set (to anything but the empty string), none is
  touched. OpenBLAS reads `OMP_NUM_THREADS` when its own variable is unset, so adding
  `OPENBLAS_NUM_THREADS=1` beside a user's `OMP_NUM_THREADS` would override it.
- Where: `autoscaler.fitchild` starts its child with the cap; `autoscaler replay` caps its process before
  it imports the replay (its fits run in it); `loadtest` caps its own processes when the package is imported
  (every `python -m loadtest.X` imports it before numpy). The controller's process is left as it is: its
  refits run in the child, and with or without the cap it holds the same memory (docs/speed.md).
- What the harness starts of the product: `loadtest` caps its own process, and a child inherits its
  environment; the controller it starts (`autoscaler run`, as a Deployment runs it) gets `uncapped`, the
  environment without the variables this process added, so the closed loop runs the controller as shipped.
- Decisions: a different thread count could in principle round a fit differently; the replay digests of
  every policy on every shared trace are the same with one thread as with the default (docs/speed.md).
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, MutableMapping

THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_ADDED: set[str] = set()  # the variables `cap_this_process` set in this process's environment


def user_set(environ: Mapping[str, str]) -> bool:
    """Whether `environ` already names a BLAS or OpenMP thread count."""
    return any(environ.get(name, "") != "" for name in THREAD_VARS)


def _cap(environ: MutableMapping[str, str]) -> None:
    if not user_set(environ):
        environ.update(dict.fromkeys(THREAD_VARS, "1"))


def capped(environ: Mapping[str, str]) -> dict[str, str]:
    """A copy of `environ` with one BLAS thread, or an unchanged copy when it names a thread count already."""
    env = dict(environ)
    _cap(env)
    return env


def cap_this_process() -> bool:
    """Cap this process's BLAS threads (see `capped`). Only libraries not loaded yet see the cap: False
    when numpy was imported before (its OpenBLAS keeps its threads; scipy's, loaded later, is capped)."""
    if not user_set(os.environ):
        _ADDED.update(THREAD_VARS)
    _cap(os.environ)
    return "numpy" not in sys.modules


def uncapped(environ: Mapping[str, str]) -> dict[str, str]:
    """A copy of `environ` without the variables `cap_this_process` added here (a user's are kept): for the
    product's own processes the harness starts, which run as shipped."""
    return {name: value for name, value in environ.items() if name not in _ADDED}
