"""The command line explains itself: every option's help names its default, and `autoscaler run` without a
config or a cluster says what is missing and where the example config is."""

import argparse

import pytest

from autoscaler.cli import build_parser, main
from loadtest import bench, controller_bench, controllerday, decide_bench
from loadtest.e2e import __main__ as e2e

from helpers import ROOT


def _options(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _options(sub)
        elif action.option_strings and not isinstance(action, argparse._HelpAction):
            yield parser.prog, action


def _parser_of(call) -> argparse.ArgumentParser:
    """The parser a command builds: `call` runs until it parses its arguments, where it stops."""
    captured = {}

    class Stop(Exception):
        pass

    def grab(self, args=None, namespace=None):
        captured["parser"] = self
        raise Stop

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = grab
    try:
        with pytest.raises(Stop):
            call()
    finally:
        argparse.ArgumentParser.parse_args = original
    return captured["parser"]


PARSERS = {
    "autoscaler": build_parser,
    "bench": lambda: _parser_of(lambda: bench.parse_args([])),
    "decide_bench": lambda: _parser_of(lambda: decide_bench.main([])),
    "controller_bench": lambda: _parser_of(lambda: controller_bench.main([])),
    "controllerday": lambda: _parser_of(lambda: controllerday.main([])),
    "e2e": lambda: _parser_of(lambda: e2e.main([])),
}


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_option_has_help_naming_its_default(name):
    options = list(_options(PARSERS[name]()))
    assert options
    missing = [f"{prog} {action.option_strings[0]}" for prog, action in options
               if ("required" if action.required else "default") not in (action.help or "")]
    assert not missing, missing


def test_decide_bench_names_itself_not_the_benchmark():
    parser = PARSERS["decide_bench"]()
    assert parser.prog == "python -m loadtest.decide_bench" and "--policies" in parser.description


def test_run_without_a_config_names_the_example(monkeypatch, capsys):
    for name in [n for n in __import__("os").environ if n.startswith("AUTOSCALER_")]:
        monkeypatch.delenv(name)
    assert main(["run"]) == 2
    err = capsys.readouterr().err
    assert "run needs a config: --config FILE" in err and "deploy/base/configmap.yaml" in err
    assert (ROOT / "deploy/base/configmap.yaml").exists()
    assert "autoscaler replay loadtest/recordings/fleet-3h/recording.json" in err


def test_run_without_a_cluster_says_so(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    config = tmp_path / "config.yaml"
    config.write_text("target: {namespace: llm, name: model}\nprometheus: {url: 'http://127.0.0.1:9'}\n")
    assert main(["run", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "run needs a cluster" in err and "--kubeconfig" in err
