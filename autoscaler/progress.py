"""Progress bars for the offline commands (replay, analyze, the benchmark and its frontier sweep).

A bar is shown only when its stream (stderr) is a terminal and the `CI` environment variable is unset or
empty: piped, redirected or in CI the output is exactly what it was without bars. Without tqdm (installed
with the `replay` extra; the controller's image has no extras) there is simply no bar. The controller's run
path never imports this module (import-linter contract in pyproject.toml), so it never loads tqdm.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import IO, Any


class NoBar:
    """What `bar` returns when progress is off: every call does nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def enabled(stream: IO[Any] | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """On a terminal and outside CI."""
    stream = sys.stderr if stream is None else stream
    environ = os.environ if environ is None else environ
    if environ.get("CI"):
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def bar(*, total: int, label: str, unit: str = "tick", stream: IO[Any] | None = None) -> Any:
    """A tqdm bar on stderr (cleared when closed) when `enabled`, else a `NoBar`."""
    stream = sys.stderr if stream is None else stream
    if not enabled(stream):
        return NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # installed without the `replay` extra: no bar
        return NoBar()
    return tqdm(total=total, desc=label, unit=unit, file=stream, leave=False, mininterval=0.5)
