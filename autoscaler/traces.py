"""Readers for the public trace formats, by path, so any trace of the same format works.

- Azure LLM inference CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`): per request.
- Mooncake JSONL (`timestamp` ms, `input_length`, `output_length`): per request.
- ServeGen folder of `chunk-<i>-trace.csv` (window start s, rate req/s, inter-arrival CV, family, 2 params),
  optionally with `chunk-<i>-dataset.json` token-length distributions: per-client rates and inter-arrival
  CVs in 10-min windows, kept per client (a batchy client bursts by its own volume, not the aggregate's)
  and summed into one aggregate rate per window.

Bad input raises `TraceError` naming the file, the line and the field: also a file that is not UTF-8 text, a
request with no token or more than `autoscaler.limits.MAX_TOKENS_PER_REQUEST`, ServeGen windows that do not
increase, and a trace spanning more than `autoscaler.limits.MAX_SPAN_S`.
"""

from __future__ import annotations

import ast
import csv
import json
import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from autoscaler.errors import TraceError
from autoscaler.limits import MAX_TOKENS_PER_REQUEST, check_span
from autoscaler.textfile import lines, read_text

@dataclass(frozen=True)
class RequestTrace:
    name: str
    arrival_s: np.ndarray  # sorted, from 0
    input_tokens: np.ndarray
    output_tokens: np.ndarray

    @property
    def span_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self.arrival_s) else 0.0


@dataclass(frozen=True)
class RateTrace:
    name: str
    window_s: float
    rate_per_s: np.ndarray  # per window, aggregate
    client_rate_per_s: np.ndarray  # clients x windows
    client_cv2: np.ndarray  # clients x windows, squared inter-arrival CV (1 where unknown)
    input_tokens: np.ndarray  # request-weighted mean per window (NaN = unknown)
    output_tokens: np.ndarray

    @property
    def span_s(self) -> float:
        return self.window_s * len(self.rate_per_s)


def _number(text: str, path: Path, line: int, field: str, kind=float) -> float:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise TraceError(f"{path}:{line}: field {field!r}: not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{path}:{line}: field {field!r}: must be finite and >= 0, got {text!r}")
    return value


def _timestamp(text: str, path: Path, line: int) -> float:
    # Seven fractional digits ("18:17:03.9799600"); datetime takes at most six.
    match = re.fullmatch(r"(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:\.(\d+))?", text.strip())
    if not match:
        raise TraceError(f"{path}:{line}: field 'TIMESTAMP': not 'YYYY-MM-DD HH:MM:SS[.f]': {text!r}")
    try:
        base = datetime.fromisoformat(match.group(1)).replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        raise TraceError(f"{path}:{line}: field 'TIMESTAMP': invalid date {text!r}") from None
    fraction = float("0." + match.group(2)) if match.group(2) else 0.0
    return base + fraction


def _tokens(values: tuple[float, float], path: Path, line: int, fields: tuple[str, str]) -> tuple[float, float]:
    """A request's input and output tokens: at least one in all (a request with none occupies no slot and
    makes the load unscalable), at most `MAX_TOKENS_PER_REQUEST` each."""
    for value, field in zip(values, fields):
        if value > MAX_TOKENS_PER_REQUEST:
            raise TraceError(f"{path}:{line}: field {field!r}: {value:.0f} tokens, more than the "
                             f"{MAX_TOKENS_PER_REQUEST} a request may hold")
    if sum(values) < 1:
        raise TraceError(f"{path}:{line}: fields {fields[0]!r} and {fields[1]!r}: a request needs at least one token, "
                         f"got {values[0]:g} and {values[1]:g}")
    return values


def _finish(name: str, rows: list[tuple[float, float, float]], path: Path) -> RequestTrace:
    if not rows:
        raise TraceError(f"{path}: no requests")
    data = np.array(rows, dtype=float)
    check_span(start_s=float(data[:, 0].min()), end_s=float(data[:, 0].max()), source=str(path), error=TraceError)
    order = np.argsort(data[:, 0], kind="stable")
    data = data[order]
    return RequestTrace(name, data[:, 0] - data[0, 0], data[:, 1], data[:, 2])


def read_azure_csv(path: Path) -> RequestTrace:
    reader = csv.reader(lines(path, TraceError))
    header = next(reader, None)
    expected = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
    if header is None or [h.strip() for h in header] != expected:
        raise TraceError(f"{path}:1: header must be {','.join(expected)}, got {header!r}")
    rows = []
    for line, row in enumerate(reader, start=2):
        if len(row) != 3:
            raise TraceError(f"{path}:{line}: expected 3 fields, got {len(row)}")
        names = ("ContextTokens", "GeneratedTokens")
        tokens = (_number(row[1], path, line, names[0], int), _number(row[2], path, line, names[1], int))
        rows.append((_timestamp(row[0], path, line), *_tokens(tokens, path, line, names)))
    return _finish(path.parent.name or path.stem, rows, path)


def iter_json_objects(path: Path, error: type[ValueError]):
    """(line number, object) for each non-blank line of a JSONL file; `error` names file and line."""
    for line, text in enumerate(lines(path, error), start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise error(f"{path}:{line}: not JSON: {exc.msg}") from None
        if not isinstance(record, dict):
            raise error(f"{path}:{line}: expected a JSON object")
        yield line, record


def read_mooncake_jsonl(path: Path) -> RequestTrace:
    rows = []
    for line, record in iter_json_objects(path, TraceError):
        values = []
        for field in ("timestamp", "input_length", "output_length"):
            if field not in record:
                raise TraceError(f"{path}:{line}: field {field!r} is missing")
            values.append(_number(record[field], path, line, field))
        tokens = _tokens((values[1], values[2]), path, line, ("input_length", "output_length"))
        rows.append((values[0] / 1000.0, *tokens))
    return _finish(path.parent.name or path.stem, rows, path)


def _dataset_means(path: Path, windows: int, window_s: float) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-window mean input/output tokens from a ServeGen dataset.json (keys: period starts in s)."""
    if not path.exists():
        return None
    try:
        data = json.loads(read_text(path, TraceError))
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise TraceError(f"{path}: expected an object keyed by window start (s), got {type(data).__name__}")
    starts = sorted((_window_key(k, path), v) for k, v in data.items())
    ins, outs = np.full(windows, np.nan), np.full(windows, np.nan)
    for index, (start, entry) in enumerate(starts):
        end = starts[index + 1][0] if index + 1 < len(starts) else math.inf
        means = []
        for field in ("input_tokens", "output_tokens"):
            try:
                dist = ast.literal_eval(entry.get(field, "{}")) if isinstance(entry, dict) else None
            except (ValueError, SyntaxError):
                raise TraceError(f"{path}: key {start:.0f}: field {field!r}: not a distribution") from None
            if not isinstance(dist, dict):
                raise TraceError(f"{path}: key {start:.0f}: field {field!r}: not a distribution")
            means.append(_mean(dist, path, start, field))
        lo = int(start // window_s)
        hi = windows if end == math.inf else int(end // window_s)
        ins[lo:hi], outs[lo:hi] = means
    return ins, outs


def _window_key(key: str, path: Path) -> float:
    try:
        start = float(key)
    except ValueError:
        start = math.nan
    if not (math.isfinite(start) and start >= 0):
        raise TraceError(f"{path}: key {key!r}: expected a window start in seconds (a number >= 0)")
    return start


def _mean(dist: dict, path: Path, start: float, field: str) -> float:
    """The mean of a {tokens: probability} distribution (NaN when its weights sum to 0)."""
    try:
        pairs = [(float(k), float(p)) for k, p in dist.items()]
    except (TypeError, ValueError):
        raise TraceError(f"{path}: key {start:.0f}: field {field!r}: not a distribution of numbers") from None
    if not all(math.isfinite(k) and math.isfinite(p) and p >= 0 for k, p in pairs):
        raise TraceError(f"{path}: key {start:.0f}: field {field!r}: tokens and weights must be finite, weights >= 0")
    total = sum(p for _, p in pairs)
    return sum(k * p for k, p in pairs) / total if total > 0 else np.nan


def _chunk(path: Path) -> tuple[list[float], list[float], list[float]]:
    """One ServeGen client: window starts (increasing), rates and inter-arrival CVs."""
    starts, rates, cvs = [], [], []
    for line, row in enumerate(csv.reader(lines(path, TraceError)), start=1):
        if not row:
            continue
        if len(row) < 3:
            raise TraceError(f"{path}:{line}: expected at least 3 fields, got {len(row)}")
        start = _number(row[0], path, line, "window start")
        if starts and start <= starts[-1]:
            raise TraceError(f"{path}:{line}: field 'window start': {start:g} does not come after the previous "
                             f"window's {starts[-1]:g}; windows must increase")
        starts.append(start)
        rates.append(_number(row[1], path, line, "rate"))
        cvs.append(_number(row[2], path, line, "cv") if row[2] else 1.0)
    if not starts:
        raise TraceError(f"{path}: empty; expected rows of window start (s), rate (req/s), inter-arrival CV")
    return starts, rates, cvs


def read_servegen(folder: Path) -> RateTrace:
    files = sorted(folder.glob("chunk-*-trace.csv"), key=lambda p: int(re.findall(r"\d+", p.name)[0]))
    if not files:
        raise TraceError(f"{folder}: no chunk-<i>-trace.csv files")
    clients = []
    window_s = None
    for path in files:
        starts, rates, cvs = _chunk(path)
        if len(starts) > 1:
            window_s = window_s or starts[1] - starts[0]
        clients.append((path, np.array(starts), np.array(rates), np.array(cvs)))
    window_s = window_s or 600.0
    first, last = min(s[0] for _, s, _, _ in clients), max(s[-1] for _, s, _, _ in clients)
    check_span(start_s=first, end_s=last + window_s, source=str(folder), error=TraceError)
    windows = int(last // window_s) + 1
    rate = np.zeros(windows)
    client_rate = np.zeros((len(clients), windows))
    client_cv2 = np.ones((len(clients), windows))
    tok_in = np.zeros(windows)
    tok_out = np.zeros(windows)
    tok_weight = np.zeros(windows)
    for row, (path, starts, rates, cvs) in enumerate(clients):
        index = (starts // window_s).astype(int)
        np.add.at(rate, index, rates)
        client_rate[row, index] = rates
        client_cv2[row, index] = np.where(rates > 0, cvs**2, 1.0)
        means = _dataset_means(path.with_name(path.name.replace("-trace.csv", "-dataset.json")), windows, window_s)
        if means is not None:
            ins, outs = means[0][index], means[1][index]
            ok = np.isfinite(ins) & np.isfinite(outs)
            np.add.at(tok_in, index[ok], rates[ok] * ins[ok])
            np.add.at(tok_out, index[ok], rates[ok] * outs[ok])
            np.add.at(tok_weight, index[ok], rates[ok])
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_in = np.where(tok_weight > 0, tok_in / tok_weight, np.nan)
        mean_out = np.where(tok_weight > 0, tok_out / tok_weight, np.nan)
    return RateTrace(folder.name, window_s, rate, client_rate, client_cv2, mean_in, mean_out)


def read_trace(path: str | Path) -> RequestTrace | RateTrace:
    """Pick the reader by what the path is: a ServeGen folder, a .jsonl, or an Azure-style .csv."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such file or folder")
    if path.is_dir():
        if list(path.glob("chunk-*-trace.csv")):
            return read_servegen(path)
        candidates = sorted(path.glob("*.csv")) + sorted(path.glob("*.jsonl"))
        if len(candidates) != 1:
            raise TraceError(f"{path}: expected one trace file or ServeGen chunk-<i>-trace.csv files")
        path = candidates[0]
    if path.suffix == ".jsonl":
        return read_mooncake_jsonl(path)
    if path.suffix == ".csv":
        return read_azure_csv(path)
    raise TraceError(f"{path}: unknown trace format (expected .csv, .jsonl or a ServeGen folder)")
