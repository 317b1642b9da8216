"""Load a `PolicySpec` from a YAML file, with errors that name the file, the field and the value."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from policies import PolicySpec


class ConfigError(ValueError):
    """Configuration that cannot be used; the message says which field and why."""


def describe(error: ValidationError, source: str) -> str:
    lines = []
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or "(spec)"
        value = item.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"{source}: field {field!r}: {item['msg']}{shown}")
    return "\n".join(lines)


def read_yaml_mapping(path: str | Path) -> dict:
    """A YAML file that must hold a mapping (empty file: empty mapping), or a ConfigError saying why."""
    path = Path(path)
    try:
        loaded = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of fields, got {type(loaded).__name__}")
    return loaded


def load_policy_spec(path: str | Path | None, **overrides) -> PolicySpec:
    data: dict = {}
    source = "policy"
    if path is not None:
        source = str(path)
        data = read_yaml_mapping(path)
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return PolicySpec(**data)
    except ValidationError as exc:
        raise ConfigError(describe(exc, source)) from None
