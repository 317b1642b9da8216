"""Stage 4, demand: what the forecaster (`forecast.py`) saw of demand this tick.

- an ingress outage it holds (an abrupt, implausible drop to ~zero arrivals: not learned, so the forecast,
  and the capacity sized on it, holds for up to `outage_hold_s`), named in the reasons;
- a statsmodels refit on this tick (the expensive tick), named and flagged in `Decision.refitted`; a due
  refit that could not run (`forecast.Fitter` raised: its process crashed, hung or did not start), named
  with its reason on every tick until a refit runs, while the previous parameters stand in;
- a steady climb (`forecast.climb`): the rate it reaches within one pod start-up, which the predictive
  stage orders early and the combine stage follows at once (a climb is demand, not a burst);
- else a rise that held (`forecast.held_rise`: above the forecast by more than the rate's noise, for half
  a start-up beyond the rate's window): the level it holds, with the cost of each mistake named. It is
  demand at that level (the predictive stage sizes for at least it and does not cut it as a one-off burst),
  not growth: a tick above it is still a burst to confirm (on servegen-deepseek-r1 seed 2, taking the
  reactive figure at once on a held rise ordered 45 replicas for one tick's 28 req/s where the held level
  needed 29, held for the scale-down window).
"""

from __future__ import annotations

from policies.spec import PolicySpec
from policies.stages import forecast as fc
from policies.types import ForecastState, Tick

REFIT_REASON = "forecast: refitted"
UNFITTED_REASON = "forecast: refit due but not run"


def refitted(fs: ForecastState, now: float) -> bool:
    """Whether statsmodels fitted the model on the tick at `now`."""
    return fs.fitted_at_s == now and fs.kind in ("holt", "holt-winters")


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """Outage and refit lines; the climb's rate at the end of one start-up, if demand climbs steadily; else
    the level a rise held, if one did."""
    assert tick.clean is not None
    fs, now = tick.state.forecast, tick.now
    lines = []
    if fc.outage_held(spec, fs, now):
        assert fs.outage_since_s is not None  # outage_held checked it
        lines.append(
            f"forecast: arrivals {tick.clean.arrival_rate_per_s or 0:.1f} req/s, far below the expected "
            f"{fc.point(fs, 1):.1f}: treated as an ingress outage since "
            f"{now - fs.outage_since_s:.0f} s (held up to {spec.outage_hold_s:.0f} s)"
        )
    if refitted(fs, now):
        lines.append(f"{REFIT_REASON} {fs.kind} on {len(fs.history)} buckets")
    if fs.unfitted is not None:
        lines.append(f"{UNFITTED_REASON} ({fs.unfitted}): the {fs.kind} model's previous parameters kept")
    rising = fc.climb(spec, fs, tick.startup_s)
    held = fc.held_rise(spec, fs, tick.startup_s) if rising is None else None
    if held is not None:
        lines.append(held[1])
    return tick.then(lines, rising=rising, held=held[0] if held is not None else None)
