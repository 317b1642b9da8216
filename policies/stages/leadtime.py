"""Stage 3, leadtime: how long until a replica ordered now serves traffic.

Learned online from what the cluster shows:
- start-up: a high percentile (`startup_percentile`) of the most recent pod placement -> Ready durations;
- node provisioning, added when no warm slot (or idle node slot) is free to land on: the waits of pods
  that were placed on a node created after them (creation -> placement, i.e. what getting a new node cost
  a replica), per node type. The same percentile is taken per type and the slowest type counts, since the
  node provisioner may pick any type the replica fits. Without such waits yet, `node_provisioning_s`.
  Node provisioning is paid once per node: replicas that land on room a node already offers (idle and warm
  slots) wait for their start-up only."""

from __future__ import annotations

from collections.abc import Iterable

from policies.spec import PolicySpec
from policies.types import Clean, Tick

_MAX_S = 86400.0  # a duration beyond a day is a clock or API error, not a sample


def remember_startups(spec: PolicySpec, samples: tuple[float, ...], clean: Clean) -> tuple[float, ...]:
    new = tuple(d for d in (clean.cluster.startup_durations_s if clean.cluster else ()) if 0 < d < _MAX_S)
    if not new:
        return samples
    return (samples + new)[-spec.startup_samples_kept :]


def _percentile(spec: PolicySpec, samples: Iterable[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(spec.startup_percentile * len(ordered)))]


def startup_s(spec: PolicySpec, samples: tuple[float, ...]) -> float:
    return _percentile(spec, samples) if samples else spec.default_startup_s


def remember_node_waits(spec: PolicySpec, samples: tuple[tuple[str, float], ...],
                        clean: Clean) -> tuple[tuple[str, float], ...]:
    new = tuple((t, d) for t, d in (clean.cluster.node_waits_s if clean.cluster else ()) if 0 < d < _MAX_S)
    if not new:
        return samples
    return (samples + new)[-spec.startup_samples_kept :]


def node_provisioning_s(spec: PolicySpec, samples: tuple[tuple[str, float], ...]) -> tuple[float, str]:
    """Node provisioning time for the lead time, and where it comes from."""
    if not samples:
        return spec.node_provisioning_s, "node_provisioning_s (no pod has waited for a new node yet)"
    by_type: dict[str, list[float]] = {}
    for kind, seconds in samples:
        by_type.setdefault(kind, []).append(seconds)
    slowest = max(by_type, key=lambda kind: (_percentile(spec, by_type[kind]), kind))
    n = len(by_type[slowest])
    return _percentile(spec, by_type[slowest]), (
        f"p{spec.startup_percentile * 100:g} of {n} pod waits for a new {slowest} node"
        + (f", the slowest of {len(by_type)} node types" if len(by_type) > 1 else ""))


def lead_time_s(spec: PolicySpec, startup: float, free_slots: int, node_s: float | None = None) -> float:
    return startup + (0.0 if free_slots > 0 else (spec.node_provisioning_s if node_s is None else node_s))


def stage(spec: PolicySpec, tick: Tick) -> Tick:
    """Start-up, node provisioning and the lead time from what `learn` remembered; a line when no slot is free."""
    assert tick.clean is not None and tick.clean.cluster is not None
    cluster = tick.clean.cluster
    startup = startup_s(spec, tick.state.startup_samples_s)
    node_s, node_why = node_provisioning_s(spec, tick.state.node_wait_samples_s)
    lead = lead_time_s(spec, startup, cluster.warm_slots_ready + cluster.idle_slots, node_s)
    lines = []
    if lead > startup:
        lines.append(f"lead time: start-up {startup:.0f} s + node provisioning {node_s:.0f} s ({node_why}); "
                     f"no warm or idle slot free")
    return tick.then(lines, startup_s=startup, node_s=node_s, lead_s=lead)
