"""Numeric command-line flags, checked by argparse: a value out of range (`--scale nan`, `--peak-replicas 0`,
`--startup-s -1`) exits with status 2 and `argument --flag: ...` naming the value, before anything runs.

    p.add_argument("--scale", type=number(above=0))
    p.add_argument("--peak-replicas", type=number(int, at_least=1))
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def number(kind: type = float, *, above: float | None = None, at_least: float | None = None,
           at_most: float | None = None) -> Callable[[str], float]:
    """An argparse `type`: a finite number of `kind` within the bounds given."""
    bounds = [f"> {above:g}" if above is not None else "", f">= {at_least:g}" if at_least is not None else "",
              f"<= {at_most:g}" if at_most is not None else ""]
    wanted = " ".join(filter(None, ["a whole number" if kind is int else "a finite number",
                                    " and ".join(b for b in bounds if b)]))

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (above is None or value > above) and (at_least is None or value >= at_least)
                and (at_most is None or value <= at_most)):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value

    parse.__name__ = wanted  # argparse names the type in some messages
    return parse
