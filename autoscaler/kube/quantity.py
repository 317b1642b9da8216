"""Kubernetes resource quantities ("500m", "64Gi", "1e3") as exact decimals, and a pod's effective requests.

The scheduler places a pod by its effective request per resource: the larger of what its containers ask
for together (plus sidecars, init containers that keep running) and what its largest regular init container
asks for, plus the pod overhead. A placeholder must ask for exactly that, or a node provisioned for it may
not fit the replica it stands in for."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_SUFFIX = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}
_FORM = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[a-zA-Z]*)$")


def parse_quantity(text: object) -> Decimal:
    """A quantity as an exact number of base units (cores, bytes, devices)."""
    match = _FORM.match(str(text).strip())
    if not match:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, suffix = match.groups()
    try:
        value = Decimal(number)
    except InvalidOperation:
        raise ValueError(f"not a Kubernetes quantity: {text!r}") from None
    if suffix[:1] in ("e", "E"):
        return value * Decimal(10) ** int(suffix[1:])
    if suffix not in _SUFFIX:
        raise ValueError(f"unknown quantity suffix {suffix!r} in {text!r}")
    return value * _SUFFIX[suffix]


def format_quantity(value: Decimal) -> str:
    """An exact form: binary multiples as such ("32Gi"), whole units, or millis (e.g. CPU "1500m")."""
    if value == value.to_integral_value():
        whole = int(value)
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            unit = int(_SUFFIX[suffix])
            if whole and whole % unit == 0:
                return f"{whole // unit}{suffix}"
        return str(whole)
    millis = value * 1000
    if millis == millis.to_integral_value():
        return f"{int(millis)}m"
    return f"{int((value * Decimal(10) ** 9).to_integral_value())}n"


def _add(total: dict[str, Decimal], resources: dict | None) -> None:
    for key, value in (resources or {}).items():
        total[key] = total.get(key, Decimal(0)) + parse_quantity(value)


def field_of(obj, name: str):
    """A field of an API object or of a dict with snake_case keys."""
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def _of(container, kind: str) -> dict | None:
    resources = field_of(container, "resources")
    if kind == "limits":
        return field_of(resources, "limits")
    # a resource with a limit and no request is requested at its limit (Kubernetes defaulting)
    return {**(field_of(resources, "limits") or {}), **(field_of(resources, "requests") or {})}


def effective_resources(pod_spec) -> tuple[dict[str, Decimal], dict[str, Decimal]]:
    """(requests, limits) of a pod spec (API object or dict with snake_case keys), as the scheduler counts
    them: max(containers + sidecars, largest init container) per resource, plus overhead."""
    result = []
    for kind in ("requests", "limits"):
        running: dict[str, Decimal] = {}
        init_peak: dict[str, Decimal] = {}
        sidecars: dict[str, Decimal] = {}
        for container in field_of(pod_spec, "containers") or []:
            _add(running, _of(container, kind))
        for container in field_of(pod_spec, "init_containers") or []:
            one: dict[str, Decimal] = {}
            _add(one, _of(container, kind))
            if field_of(container, "restart_policy") == "Always":  # a sidecar runs alongside
                _add(sidecars, {k: str(v) for k, v in one.items()})
                continue
            for key, value in one.items():  # a regular init container runs alone, with the sidecars before it
                init_peak[key] = max(init_peak.get(key, Decimal(0)), value + sidecars.get(key, Decimal(0)))
        for key, value in sidecars.items():
            running[key] = running.get(key, Decimal(0)) + value
        total = {k: max(running.get(k, Decimal(0)), init_peak.get(k, Decimal(0))) for k in running | init_peak}
        for key, value in (field_of(pod_spec, "overhead") or {}).items():
            if kind == "requests" or key in total:  # overhead raises a limit only where one is set
                total[key] = total.get(key, Decimal(0)) + parse_quantity(value)
        result.append(total)
    return result[0], result[1]
