"""The documented caps on what a replay, an analysis or the benchmark takes in (docs/faults.md).

A recording or trace is refused when it spans more than `MAX_SPAN_S` (a year and a day: two rows ten years
apart are a typo, not a year of data), and a run when it would plan more than `MAX_TICKS` ticks (173 days
at the default 15 s tick). A request may hold at most `MAX_TOKENS_PER_REQUEST` tokens and must hold at
least one; a scaled request trace at most `MAX_SIMULATED_REQUESTS` requests. Without the caps such input
plans tens of millions of ticks or copies and runs for hours or out of memory instead of saying what is
wrong.
"""

from __future__ import annotations

from autoscaler.errors import InputError

MAX_SPAN_S = 366 * 86400.0
MAX_TICKS = 1_000_000
MAX_TOKENS_PER_REQUEST = 10_000_000
MAX_SIMULATED_REQUESTS = 10_000_000


def check_span(*, start_s: float, end_s: float, source: str, error: type[InputError]) -> None:
    span_s = end_s - start_s
    if span_s > MAX_SPAN_S:
        raise error(f"{source}: spans {span_s / 86400:.1f} days (from {start_s:.0f} s to {end_s:.0f} s), more than "
                    f"the {MAX_SPAN_S / 86400:.0f} days a recording or trace may span; check its times")


def check_ticks(*, span_s: float, tick_s: float, source: str, error: type[InputError]) -> int:
    """The number of ticks a run over `span_s` plans, or `error` when it is more than `MAX_TICKS`."""
    ticks = int(span_s // tick_s) + 1
    if ticks > MAX_TICKS:
        raise error(f"{source}: {span_s / 86400:.1f} days at tick_s {tick_s:g} plan {ticks} ticks, more than the "
                    f"{MAX_TICKS} a run may plan; use a longer tick_s (--tick-s) or a shorter time range")
    return ticks
