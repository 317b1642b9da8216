"""`autoscaler analyze PATH`: read a recording or a trace, answer the four preflight questions, print the
summary (or one JSON document), write an HTML report with plots into --out, and the recommended policy
section into --write-config. The flags are checked by the parser; the recommended section is checked as
`autoscaler run` and `replay --policy` will check it before it is written, so a written file always loads."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pydantic import ValidationError

from autoscaler.analyze.demand import load
from autoscaler.analyze.questions import answer
from autoscaler.analyze.report import summary, write_config, write_html
from autoscaler.config import describe, load_policy_spec
from autoscaler.errors import ConfigError
from autoscaler.progress import bar as progress_bar
from autoscaler.replay.command import output_folder
from policies import PolicySpec


def analyze(args: argparse.Namespace) -> int:
    spec = load_policy_spec(args.policy)
    steps = progress_bar(total=3, label="analyze", unit="step")  # read, answer, report (on a terminal)
    try:
        demand = load(args.input, args.format, spec, scale=args.scale, peak_replicas=args.peak_replicas)
        steps.update()
        answers = answer(demand, spec, startup_s=args.startup_s, node_provisioning_s=args.node_provisioning_s)
        steps.update()
        if args.write_config:
            _write_config(args.write_config, answers)
        report = None
        if args.out or not args.json:
            out = output_folder(args.out, default="analyze-out")
            try:
                report = write_html(out, answers, demand)
            except ImportError:
                report = None  # no matplotlib (the container image): the summary and JSON stand alone
        steps.update()
    finally:
        steps.close()  # cleared before the summary is printed
    if args.json:
        print(json.dumps(answers, indent=2))
    else:
        print(summary(answers))
        if report is not None:
            print(f"wrote {report}")
        if args.write_config:
            print(f"wrote {args.write_config}")
    return 0


def _write_config(path: Path, answers: dict) -> None:
    try:
        PolicySpec(**answers["recommended"]["policy"])
    except ValidationError as exc:
        raise ConfigError(describe(exc, f"--write-config {path}: the recommended policy")) from None
    try:
        write_config(path, answers)
    except OSError as exc:
        raise ConfigError(f"--write-config {path}: cannot write: {exc.strerror}") from None
