"""Trace readers: the bundled trace, each format on small files, and clear errors for bad input."""

import json

import numpy as np
import pytest

from autoscaler.traces import RateTrace, RequestTrace, TraceError, read_trace
from autoscaler.sim.workload import WorkloadConfig, build

from helpers import BUNDLED_TRACE


def test_bundled_azure_trace_reads_whole():
    trace = read_trace(BUNDLED_TRACE)
    assert isinstance(trace, RequestTrace)
    assert len(trace.arrival_s) == 8819  # SOURCE.md
    assert trace.span_s == pytest.approx(3435.95, abs=0.1)
    assert np.all(np.diff(trace.arrival_s) >= 0)


def test_workload_scales_to_tens_of_replicas_and_keeps_priorities_deterministic():
    trace = read_trace(BUNDLED_TRACE)
    a = build(trace, WorkloadConfig())
    b = build(trace, WorkloadConfig())
    assert a.scale > 10
    assert np.array_equal(a.priority, b.priority) and np.array_equal(a.arrival_s, b.arrival_s)
    shares = np.bincount(a.priority, minlength=3) / len(a.priority)
    assert shares == pytest.approx([0.2, 0.5, 0.3], abs=0.01)
    per_minute_busy = np.bincount((a.arrival_s // 60).astype(int), weights=a.service_s).max() / 60
    assert 0.7 * 40 * 16 < per_minute_busy < 1.1 * 40 * 16 * 0.85


def test_mooncake_jsonl(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = (json.dumps({"timestamp": t, "input_length": 100, "output_length": 10}) for t in (0, 3000, 6000))
    path.write_text("\n".join(rows))
    trace = read_trace(path)
    assert list(trace.arrival_s) == [0.0, 3.0, 6.0]


def test_servegen_folder_aggregates_clients(tmp_path):
    (tmp_path / "chunk-0-trace.csv").write_text("0,1.0,2.0,Gamma,1,1\n600,0,0,,0,0\n")
    (tmp_path / "chunk-1-trace.csv").write_text("0,3.0,1.0,Gamma,1,1\n600,2.0,1.0,Gamma,1,1\n")
    (tmp_path / "chunk-1-dataset.json").write_text(json.dumps(
        {"0": {"input_tokens": "{100: 0.5, 300: 0.5}", "output_tokens": "{50: 1.0}", "reason_ratio": "{}"}}))
    trace = read_trace(tmp_path)
    assert isinstance(trace, RateTrace)
    assert list(trace.rate_per_s) == [4.0, 2.0]
    assert trace.client_cv2[0, 0] == 4.0
    assert trace.input_tokens[0] == pytest.approx(200.0) and trace.output_tokens[0] == pytest.approx(50.0)


@pytest.mark.parametrize(
    "name,content,match",
    [
        ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,10,x\n",
         r"a\.csv:2: field 'GeneratedTokens'"),
        ("b.csv", "TIMESTAMP,Tokens\n", r"b\.csv:1: header"),
        ("c.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n", r"c\.csv:2: field 'TIMESTAMP'"),
        ("d.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1}\n',
         r"d\.jsonl:2: field 'input_length' is missing"),
        ("e.jsonl", "{not json\n", r"e\.jsonl:1: not JSON"),
        ("f.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,-4,1\n",
         r"f\.csv:2: field 'ContextTokens': must be finite and >= 0"),
        ("g.txt", "hello", r"unknown trace format"),
    ],
)
def test_malformed_traces_name_file_line_and_field(tmp_path, name, content, match):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(TraceError, match=match):
        read_trace(path)
