"""Fault and fuzz suite: every bad input the command line takes exits with status 2, one message naming the
file, line or field and the value, no traceback, and nothing written.

Each named case is run the way a user runs it. Most run in this process through the very `main()` that
`python -m autoscaler` and `python -m loadtest.bench` call, with the exit status, stdout and stderr the
interpreter would give (an escaping exception is status 1 with its traceback on stderr, as Python prints
it), a fresh working directory and the case's environment: the start-up of a real process costs a second
or two each. A sample of them also runs as real `python -m` processes, a few at a time, to keep the entry
points honest. The fuzz tests feed mutated recordings, traces and policy files (hypothesis, derandomized:
the same inputs every run) through the same path and allow only status 0 or 2 without a traceback.
The admission endpoint's oversized header is tested on the real server in a child process.

At the end the module prints its counts (bad inputs tried, exit codes, tracebacks and hangs seen: both must
be 0), also without `-s`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import traceback
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler import cli
from autoscaler.config import load_config
from autoscaler.errors import ConfigError
from loadtest import bench
from loopthread import LoopThread
from servers import free_port

ROOT = Path(__file__).resolve().parents[1]
FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "100"))  # per fuzz test; raise it to search harder
HANG_S = 30  # a case still running after this long is a hang (the old code planned millions of ticks)
TALLY: dict[str, Counter] = {"bad": Counter(), "fuzz": Counter(), "tracebacks": Counter(), "hangs": Counter()}

BASE = "target: {namespace: llm, name: m}\nprometheus: {url: 'http://prom:9090'}\n"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _azure(rows: list[tuple[int, int]], step_s: int = 4) -> str:
    return AZURE_HEADER + "".join(f"2023-11-16 18:{15 + i * step_s // 60:02d}:{i * step_s % 60:02d}.68,{a},{b}\n"
                                  for i, (a, b) in enumerate(rows))


def _write(folder: Path, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """The bad inputs, each beside a good one of the same kind."""
    folder = tmp_path_factory.mktemp("inputs")
    binary = b"\xff\xfe\x00\x81garbage\x80\n"
    _write(folder, {
        "ok.yaml": BASE,
        "bin.yaml": binary, "bin.csv": binary, "bin.jsonl": binary, "bin.json": binary,
        "bin-trace.csv": AZURE_HEADER.encode() + binary,
        "prio.yaml": BASE + "policy: {priorities: {}}\n",
        "prio-policy.yaml": "priorities: {}\n",
        "tick.yaml": BASE + "policy: {tick_s: 1.0e-6}\n",
        "url.yaml": "target: {namespace: llm, name: m}\nprometheus: {url: 'not a url'}\n",
        "typo.yaml": "target: {namespace: llm, name: m}\n"
                     "prometheus: {url: 'http://p:9090', queries: {queue_depht: 'sum(q)'}}\n",
        "rec.csv": "t_s,arrival_rate_per_s,in_flight,spec_replicas\n0,1,2,1\n15,2,4,1\n30,3,6,1\n45,2,4,1\n",
        "twenty-days.csv": "t_s,arrival_rate_per_s\n0,1\n1728000,2\n",
        "ten-years.csv": "t_s,arrival_rate_per_s\n0,1\n315360000,2\n",
        "trace.csv": _azure([(1000 + 37 * i % 500, 200 + 13 * i % 300) for i in range(40)]),
        "zero.csv": _azure([(0, 0), (0, 0)]),
        "zero.jsonl": '{"timestamp": 0, "input_length": 0, "output_length": 0}\n'
                      '{"timestamp": 1000, "input_length": 0, "output_length": 0}\n',
        "huge.csv": _azure([(100, 99999999999), (100, 20)]),
        "tiny-work/trace.csv": _azure([(1, 0), (1, 0)]),
        "sg-empty/chunk-1-trace.csv": "",
        "sg-back/chunk-1-trace.csv": "0,1,1\n600,1,1\n300,1,1\n",
        "sg-dataset/chunk-1-trace.csv": "0,1,1\n600,1,1\n",
        "sg-dataset/chunk-1-dataset.json": "[1, 2]\n",
    })
    return folder


@dataclass
class Outcome:
    status: int | str
    stdout: str
    stderr: str
    written: list[str] = field(default_factory=list)


class _Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise _Hang()


def invoke(main, argv: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> Outcome:
    """`sys.exit(main(argv))` as the interpreter runs it, in this process, in `cwd` with `env` added."""
    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.update(env or {})
    os.chdir(cwd)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HANG_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status: int | str = main(argv)
            except SystemExit as exc:  # argparse
                status = exc.code if isinstance(exc.code, int) else 1
            except _Hang:
                status = "hang"
            except Exception:
                traceback.print_exc()
                status = 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return Outcome(status, out.getvalue(), err.getvalue(), sorted(p.name for p in cwd.iterdir()))


def _count(kind: str, outcome: Outcome) -> None:
    TALLY[kind][outcome.status] += 1
    TALLY["tracebacks"][kind] += "Traceback" in outcome.stderr
    TALLY["hangs"][kind] += outcome.status == "hang"


# (name, entry, argv with {d} for the inputs folder, environment, what the message must say)
CASES = [
    ("binary config", "autoscaler", "run --config {d}/bin.yaml", {}, r"bin\.yaml:1: not UTF-8 text: byte 0xff"),
    ("binary policy file", "autoscaler", "replay {d}/rec.csv --policy {d}/bin.yaml --no-plot", {},
     r"bin\.yaml:1: not UTF-8 text"),
    ("binary CSV recording", "autoscaler", "replay {d}/bin.csv --no-plot", {}, r"bin\.csv:1: not UTF-8 text"),
    ("binary JSONL recording", "autoscaler", "replay {d}/bin.jsonl --no-plot", {}, r"bin\.jsonl:1: not UTF-8 text"),
    ("binary Prometheus recording", "autoscaler", "replay {d}/bin.json --no-plot", {}, r"bin\.json:1: not UTF-8"),
    ("binary trace (replay)", "autoscaler", "replay --format trace {d}/bin-trace.csv --no-plot", {},
     r"bin-trace\.csv:2: not UTF-8 text: byte 0xff at column 1"),
    ("binary trace (analyze)", "autoscaler", "analyze {d}/bin-trace.csv --json", {}, r"bin-trace\.csv:2: not UTF-8"),
    ("binary recording (analyze)", "autoscaler", "analyze {d}/bin.csv --json", {}, r"bin\.csv:1: not UTF-8"),
    ("empty priorities (config)", "autoscaler", "run --config {d}/prio.yaml", {},
     r"prio\.yaml: field 'policy\.priorities': .*at least 1 item"),
    ("empty priorities (policy)", "autoscaler", "replay {d}/rec.csv --policy {d}/prio-policy.yaml --no-plot", {},
     r"prio-policy\.yaml: field 'priorities'"),
    ("tick_s 1e-6 (config)", "autoscaler", "run --config {d}/tick.yaml", {},
     r"tick\.yaml: field 'policy\.tick_s': .*greater than or equal to 1 \(got 1e-06\)"),
    ("--tick-s 1e-6", "autoscaler", "replay {d}/rec.csv --tick-s 1e-6 --no-plot", {},
     r"argument --tick-s: expected a finite number >= 1 and <= 300, got '1e-6'"),
    ("20 days at 1 s ticks", "autoscaler", "replay {d}/twenty-days.csv --tick-s 1 --no-plot", {},
     r"twenty-days\.csv: 20\.0 days at tick_s 1 plan 1728001 ticks, more than the 1000000"),
    ("empty AUTOSCALER_PROMETHEUS__URL", "autoscaler", "run --config {d}/ok.yaml",
     {"AUTOSCALER_PROMETHEUS__URL": ""},
     r"^error: environment variable AUTOSCALER_PROMETHEUS__URL: field 'prometheus\.url'.*\(got ''\)"),
    ("prometheus.url not a URL", "autoscaler", "run --config {d}/url.yaml", {},
     r"url\.yaml: field 'prometheus\.url': .*http\(s\) URL.*\(got 'not a url'\)"),
    ("misspelt query name", "autoscaler", "run --config {d}/typo.yaml", {},
     r"typo\.yaml: field 'prometheus\.queries': .*unknown signal 'queue_depht'; did you mean 'queue_depth'"),
    ("environment override error", "autoscaler", "run --config {d}/ok.yaml",
     {"AUTOSCALER_POLICY__MAX_REPLICAS": "lots"},
     r"^error: environment variable AUTOSCALER_POLICY__MAX_REPLICAS: field 'policy\.max_replicas'.*\(got 'lots'\)"),
    ("invalid JSON in a variable", "autoscaler", "run --config {d}/ok.yaml", {"AUTOSCALER_TARGET": "{oops"},
     r"^error: environment variable AUTOSCALER_TARGET: not valid JSON .*got '\{oops'"),
    ("analyze --startup-s -1", "autoscaler", "analyze {d}/rec.csv --startup-s -1 --write-config policy.yaml", {},
     r"argument --startup-s: expected a finite number > 0, got '-1'"),
    ("analyze --node-provisioning-s -1", "autoscaler", "analyze {d}/rec.csv --node-provisioning-s -1 --json", {},
     r"argument --node-provisioning-s: expected a finite number >= 0, got '-1'"),
    ("analyze --peak-replicas 0", "autoscaler", "analyze {d}/trace.csv --peak-replicas 0 --json", {},
     r"argument --peak-replicas: expected a whole number >= 1, got '0'"),
    ("analyze --peak-replicas -5", "autoscaler", "analyze {d}/trace.csv --peak-replicas -5 --json", {},
     r"argument --peak-replicas: .* got '-5'"),
    ("analyze --scale nan", "autoscaler", "analyze {d}/trace.csv --scale nan --json", {},
     r"argument --scale: expected a finite number > 0, got 'nan'"),
    ("bench --peak-replicas 0", "bench", "--trace {d}/trace.csv --peak-replicas 0", {},
     r"argument --peak-replicas: expected a whole number >= 1, got '0'"),
    ("bench --peak-replicas -5", "bench", "--trace {d}/trace.csv --peak-replicas -5", {}, r"--peak-replicas: .*'-5'"),
    ("bench --scale nan", "bench", "--trace {d}/trace.csv --scale nan", {}, r"argument --scale: .*got 'nan'"),
    ("bench --gpu-hour-price inf", "bench", "--trace {d}/trace.csv --gpu-hour-price inf", {},
     r"argument --gpu-hour-price: expected a finite number >= 0, got 'inf'"),
    ("bench --gpus-per-node 1.5", "bench", "--trace {d}/trace.csv --gpus-per-node 1.5", {},
     r"argument --gpus-per-node: expected a whole number >= 1, got '1\.5'"),
    ("bench --priority-mix nan", "bench", "--trace {d}/trace.csv --priority-mix nan,0.5,0.3", {},
     r"--priority-mix: expected 3 non-negative shares .* got 'nan,0\.5,0\.3'"),
    ("rows ten years apart (replay)", "autoscaler", "replay {d}/ten-years.csv --no-plot", {},
     r"ten-years\.csv: spans 3650\.0 days .*more than the 366 days"),
    ("rows ten years apart (simulated)", "autoscaler", "replay {d}/ten-years.csv --mode simulated --no-plot", {},
     r"ten-years\.csv: spans 3650\.0 days"),
    ("rows ten years apart (analyze)", "autoscaler", "analyze {d}/ten-years.csv --json", {},
     r"ten-years\.csv: spans 3650\.0 days"),
    ("0-token requests (replay)", "autoscaler", "replay --format trace {d}/zero.csv --no-plot", {},
     r"zero\.csv:2: fields 'ContextTokens' and 'GeneratedTokens': a request needs at least one token, got 0 and 0"),
    ("0-token requests (analyze)", "autoscaler", "analyze {d}/zero.jsonl --json", {},
     r"zero\.jsonl:1: fields 'input_length' and 'output_length': a request needs at least one token"),
    ("0-token requests (bench)", "bench", "--trace {d}/zero.csv --policies static", {}, r"zero\.csv:2: fields"),
    ("99999999999 tokens (replay)", "autoscaler", "replay --format trace {d}/huge.csv --no-plot", {},
     r"huge\.csv:2: field 'GeneratedTokens': 99999999999 tokens, more than the 10000000"),
    ("99999999999 tokens (analyze)", "autoscaler", "analyze {d}/huge.csv --json", {}, r"huge\.csv:2: .*99999999999"),
    ("99999999999 tokens (bench)", "bench", "--trace {d}/huge.csv --policies static", {},
     r"huge\.csv:2: .*99999999999"),
    ("1-token trace scaled to 40 replicas", "autoscaler", "analyze {d}/tiny-work/trace.csv --peak-replicas 40 --json",
     {}, r"trace 'tiny-work': scaling by x.* requests, more than the 10000000 a run may simulate"),
    ("record --out into a missing folder", "autoscaler",
     "record --config {d}/ok.yaml --start now-1h --out missing/recording.json", {},
     r"--out missing/recording\.json: the folder missing does not exist"),
    ("record --prometheus-url not a URL", "autoscaler",
     "record --config {d}/ok.yaml --prometheus-url prom:9090 --start now-1h --out recording.json", {},
     r"--prometheus-url 'prom:9090': expected an http\(s\) URL"),
    ("replay --default-priority gold", "autoscaler",
     "replay {d}/rec.csv --mode simulated --default-priority gold --no-plot", {},
     r"--default-priority 'gold' is not one of the policy's classes"),
    ("replay --out onto a file", "autoscaler", "replay {d}/rec.csv --out {d}/rec.csv/out --no-plot", {},
     r"--out .*rec\.csv/out: cannot create the output folder: .*rec\.csv is a file"),
    ("empty ServeGen chunk", "autoscaler", "analyze {d}/sg-empty --json", {},
     r"sg-empty/chunk-1-trace\.csv: empty"),
    ("ServeGen windows going back", "autoscaler", "replay --format trace {d}/sg-back --no-plot", {},
     r"sg-back/chunk-1-trace\.csv:3: field 'window start': 300 does not come after the previous window's 600"),
    ("ServeGen dataset not an object", "autoscaler", "analyze {d}/sg-dataset --json", {},
     r"sg-dataset/chunk-1-dataset\.json: expected an object keyed by window start \(s\), got list"),
]
ENTRIES = {"autoscaler": cli.main, "bench": bench.main}
MODULES = {"autoscaler": "autoscaler", "bench": "loadtest.bench"}
# Run as real processes too: one per entry point and kind of failure (argparse, config, reader, cap).
IN_PROCESSES = ("binary config", "invalid JSON in a variable", "bench --scale nan", "rows ten years apart (replay)")


def _argv(case, folder: Path) -> list[str]:
    return case[2].format(d=folder).split()


def _assert_refused(outcome: Outcome, case) -> None:
    name, *_, pattern = case
    assert "Traceback" not in outcome.stderr, f"{name}: traceback\n{outcome.stderr}"
    assert outcome.status == 2, f"{name}: exit status {outcome.status}\n{outcome.stderr[-2000:]}"
    message = outcome.stderr.strip().splitlines()
    assert message, f"{name}: no message"
    assert any(re.search(pattern, line) for line in message), f"{name}: {pattern!r} not in\n{outcome.stderr}"
    assert outcome.written == [], f"{name}: wrote {outcome.written}"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_naming_the_culprit_and_writes_nothing(case, inputs, tmp_path):
    before = sorted(str(p) for p in inputs.rglob("*"))
    outcome = invoke(ENTRIES[case[1]], _argv(case, inputs), cwd=tmp_path, env=case[3])
    _count("bad", outcome)
    _assert_refused(outcome, case)
    assert sorted(str(p) for p in inputs.rglob("*")) == before  # nothing written beside the inputs either


def _process(case, folder: Path, cwd: Path) -> Outcome:
    env = {**os.environ, **case[3], "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", MODULES[case[1]], *_argv(case, folder)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    return Outcome(done.returncode, done.stdout, done.stderr, sorted(p.name for p in cwd.iterdir()))


def test_the_entry_points_refuse_the_same_as_real_processes(inputs, tmp_path):
    cases = [c for c in CASES if c[0] in IN_PROCESSES]
    folders = [tmp_path / str(i) for i in range(len(cases))]
    for folder in folders:
        folder.mkdir()
    with ThreadPoolExecutor(max_workers=3) as pool:  # start-up is the cost; two cores are shared
        outcomes = list(pool.map(lambda c, f: _process(c, inputs, f), cases, folders))
    for case, outcome in zip(cases, outcomes):
        _count("bad", outcome)
        _assert_refused(outcome, case)


@contextlib.contextmanager
def _answering(body) -> str:
    """A local HTTP server answering every request with `body` as JSON; yields its URL."""
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(body)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner, loop, port = web.AppRunner(app), LoopThread(), free_port()
    loop.run(runner.setup())
    loop.run(web.TCPSite(runner, "127.0.0.1", port).start())
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.run(runner.cleanup())
        loop.close()


@pytest.mark.parametrize("body,pattern", [
    ([1, 2, 3], r"^error: http://127\.0\.0\.1:\d+: not a Prometheus API: its query_range answer for 'queue_depth'"),
    ({"status": "success", "data": {"resultType": "matrix", "result": [{"values": "no"}]}},
     r"not a Prometheus query_range answer: http://127\.0\.0\.1:\d+: signal 'queue_depth': series 0: field 'values'"),
])
def test_record_against_a_server_that_is_not_prometheus(inputs, tmp_path, body, pattern):
    with _answering(body) as url:
        outcome = invoke(cli.main, ["record", "--config", str(inputs / "ok.yaml"), "--prometheus-url", url,
                                    "--start", "now-1h", "--out", "recording.json"], cwd=tmp_path)
    _count("bad", outcome)
    _assert_refused(outcome, ("record against a non-Prometheus", "", "", {}, pattern))


def test_analyze_never_writes_a_policy_section_the_controller_would_reject(inputs, tmp_path, monkeypatch):
    """The recommended section is checked as `autoscaler run` checks it before it is written."""
    from autoscaler.analyze import command

    def answer(*args, **kwargs):
        answers = real(*args, **kwargs)
        answers["recommended"]["policy"]["default_startup_s"] = -1.0  # what --startup-s -1 used to produce
        return answers

    real = command.answer
    monkeypatch.setattr(command, "answer", answer)
    outcome = invoke(cli.main, ["analyze", str(inputs / "rec.csv"), "--json", "--write-config", "policy.yaml"],
                     cwd=tmp_path)
    _count("bad", outcome)
    _assert_refused(outcome, ("analyze's own recommendation", "", "", {},
                              r"--write-config policy\.yaml: the recommended policy: field 'default_startup_s': .*-1"))


SERVE = """
import asyncio, sys
from autoscaler.admission import Admission
from autoscaler.board import DecisionBoard
from autoscaler.runtime import _serve, configure_logging

async def main():
    configure_logging()
    admission = Admission(DecisionBoard(), priorities={"critical": 1, "standard": 0}, header="x-request-priority",
                          default_class="standard", retry_after_s=5)
    runner = await _serve(admission.app(), "127.0.0.1", int(sys.argv[1]))
    print("serving", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await runner.cleanup()

asyncio.run(main())
"""


def _status(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_an_oversized_header_is_a_4xx_with_one_json_log_line():
    """The admission endpoint as `autoscaler run` serves it: a 9 KB header (a big cookie or token the gateway
    forwards) is answered, not refused; one beyond the 64 KiB limit gets a 400 and one JSON log line."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVE, str(port)], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "serving", server.stderr.read()
        url = f"http://127.0.0.1:{port}/auth_request"
        assert _status(url, {"x-big": "a" * 9 * 1024, "x-request-priority": "standard"}) == 200
        assert _status(url, {"x-big": "a" * 100 * 1024}) == 400
    finally:
        stdout, stderr = server.communicate("", timeout=30)
    lines = [line for line in stdout.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is JSON
    bad = [r for r in records if r.get("event") == "bad request"]
    assert len(bad) == 1 and len(records) == 1, stdout
    assert bad[0]["status"] == 400 and "65536 bytes" in bad[0]["error"] and "aaaa" not in bad[0]["error"], bad
    assert "Traceback" not in stdout + stderr, stdout + stderr
    TALLY["bad"][f"HTTP {bad[0]['status']}"] += 1


# Fuzz: mutated copies of good inputs, through the same commands.
WEIRD = ["", "nan", "inf", "-inf", "-1", "0", "1e308", "1e-320", "99999999999999999999", "abc", "\u00e9", '"', "{",
         "[]", "null", "true", "2023-13-45", "-0", "0x10", "1_000"]
GOOD = {
    "recording.csv": ("replay {f} --no-plot", "t_s,arrival_rate_per_s,in_flight,spec_replicas\n0,1,2,1\n15,2,4,1\n"
                      "30,3,6,1\n"),
    "recording.jsonl": ("replay {f} --no-plot", '{"t_s": 0, "arrival_rate_per_s": 1}\n{"t_s": 15, "in_flight": 2}\n'),
    "trace.csv": ("analyze {f} --json", _azure([(1000, 200), (800, 300), (1200, 100)])),
    "trace.jsonl": ("analyze {f} --json", '{"timestamp": 0, "input_length": 900, "output_length": 90}\n'
                    '{"timestamp": 4000, "input_length": 500, "output_length": 50}\n'),
    "policy.yaml": ("replay {rec} --policy {f} --no-plot", "tick_s: 15\nmax_replicas: 8\nmin_replicas: 1\n"
                    "priorities: {critical: 1, standard: 0}\nslo_queue_wait_s: 2\n"),
}


def _mutate(text: str, data) -> str:
    """Replace one token (a run between separators) with a weird value, or cut the text, or insert bytes."""
    tokens = re.split(r"([,:\n{}\[\]\" ])", text)
    how = data.draw(st.sampled_from(["replace", "replace", "truncate", "insert"]))
    if how == "truncate":
        return text[: data.draw(st.integers(0, len(text)))]
    if how == "insert":
        at = data.draw(st.integers(0, len(text)))
        return text[:at] + data.draw(st.text(max_size=6)) + text[at:]
    spots = [i for i, t in enumerate(tokens) if t.strip(",:\n{}[]\" ")]
    tokens[data.draw(st.sampled_from(spots))] = data.draw(st.sampled_from(WEIRD))
    return "".join(tokens)


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_inputs_exit_0_or_2_without_traceback(data, inputs, tmp_path_factory):
    name = data.draw(st.sampled_from(sorted(GOOD)))
    template, good = GOOD[name]
    folder = tmp_path_factory.mktemp("fuzz")
    path = folder / name
    path.write_text(_mutate(good, data), encoding="utf-8")
    argv = template.format(f=path, rec=inputs / "rec.csv").split()
    outcome = invoke(cli.main, argv, cwd=folder)
    _count("fuzz", outcome)
    assert "Traceback" not in outcome.stderr, f"{argv}\n{path.read_text()!r}\n{outcome.stderr}"
    assert outcome.status in (0, 2), f"{argv}: {outcome.status}\n{outcome.stderr}"
    if outcome.status == 2:
        assert outcome.stderr.strip().splitlines()[-1].startswith(("error: ", "autoscaler ")), outcome.stderr
        assert path.name in outcome.stderr or "argument" in outcome.stderr, outcome.stderr


CONFIG_FIELDS = ["mode", "model_server", "tick_deadline_s", "http_port", "prometheus.url", "prometheus.timeout_s",
                 "prometheus.queries", "prometheus.rate_window_s", "scrape.port", "policy.tick_s", "policy.priorities",
                 "policy.max_replicas", "policy.slo_miss_target_ratio", "admission.default_priority",
                 "admission.retry_after_s", "leader_election.lease_duration_s", "capacity.gpu_hour_price", "target"]
VALUES = [None, "", -1, 0, 1e-9, 1e308, float("nan"), float("inf"), "x", [], {}, {"queue_depht": "q"}, True,
          "http://", "ftp://p", 2**70]


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True)
@given(path=st.sampled_from(CONFIG_FIELDS), value=st.sampled_from(VALUES), via_env=st.booleans())
def test_fuzzed_configs_load_or_name_the_field(path, value, via_env, tmp_path_factory):
    """Every config value, from the file or from an AUTOSCALER_* variable, loads or is refused as a
    ConfigError that names the field (or the variable), never another exception."""
    import yaml

    data = yaml.safe_load(BASE)
    keys = path.split(".")
    folder = tmp_path_factory.mktemp("config")
    config = folder / "config.yaml"
    with pytest.MonkeyPatch.context() as env:
        if via_env:
            text = value if isinstance(value, str) else json.dumps(value)
            env.setenv("AUTOSCALER_" + "__".join(k.upper() for k in keys), text)
        else:
            node = data
            for key in keys[:-1]:
                node = node.setdefault(key, {})
            node[keys[-1]] = value
        config.write_text(yaml.safe_dump(data))
        try:
            load_config(config)
            TALLY["fuzz"]["loaded"] += 1
        except ConfigError as exc:
            TALLY["fuzz"]["ConfigError"] += 1
            assert keys[0] in str(exc) or "AUTOSCALER_" in str(exc), str(exc)


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    yield
    bad, fuzz = TALLY["bad"], TALLY["fuzz"]
    tracebacks, hangs = sum(TALLY["tracebacks"].values()), sum(TALLY["hangs"].values())
    lines = [f"fault-and-fuzz: {sum(bad.values())} bad inputs tried, exit codes {dict(sorted(bad.items(), key=str))}",
             f"fault-and-fuzz: {sum(fuzz.values())} fuzzed inputs, outcomes {dict(sorted(fuzz.items(), key=str))}",
             f"fault-and-fuzz: tracebacks seen {tracebacks}, hangs seen {hangs}"]
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print("\n" + "\n".join(lines))
