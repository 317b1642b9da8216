"""Controller configuration: file plus environment, validated once, errors naming field and value."""

import pytest

from autoscaler.config import Mode, load_config
from autoscaler.errors import ConfigError
from autoscaler.presets import DCGM_HEADROOM, PRESETS, queries


def write(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


BASE = "target: {namespace: llm, name: m}\nprometheus: {url: 'http://prom:9090', selector: 'job=\"vllm\"'}\n"


def test_environment_overrides_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOSCALER_MODE", "actuate")
    monkeypatch.setenv("AUTOSCALER_POLICY__MAX_REPLICAS", "7")
    settings = load_config(write(tmp_path, BASE + "mode: shadow\npolicy: {tick_s: 10}\n"))
    assert settings.mode == Mode.actuate and settings.policy.max_replicas == 7
    assert settings.tick_s == 10 and settings.deadline_s == 8.0  # the loop runs at the policy's tick


@pytest.mark.parametrize("extra,match", [
    ("policy: {tick_s: 0}\n", r"field 'policy.tick_s'.*greater than 0.*got 0"),
    ("tick_s: 10\n", r"field 'tick_s': set the loop's period as policy.tick_s"),
    ("policy: {tick_s: 10}\ntick_deadline_s: 12\n", r"tick_deadline_s \(12.0\) must not exceed policy.tick_s"),
    ("model_server: llamacpp\n", r"model_server 'llamacpp' is not one of"),
    ("policy: {min_replicas: 5, max_replicas: 2}\n", r"min_replicas \(5\) must not exceed max_replicas \(2\)"),
    ("leader_election: {lease_duration_s: 5, renew_deadline_s: 10}\n", r"renew_deadline_s \(10.0\) < lease_duration_s"),
    ("admission: {default_priority: gold}\n", r"default_priority 'gold'"),
    ("surprise: 1\n", r"surprise"),
])
def test_invalid_values_name_the_field(tmp_path, extra, match):
    with pytest.raises(ConfigError, match=match):
        load_config(write(tmp_path, BASE + extra))


def test_a_source_is_required(tmp_path):
    with pytest.raises(ConfigError, match="no signal source"):
        load_config(write(tmp_path, "target: {namespace: llm, name: m}\n"))
    settings = load_config(write(tmp_path, "target: {namespace: llm, name: m}\nscrape: {enabled: true}\n"))
    assert settings.scrape.enabled


def test_presets_fill_the_selector_and_accept_overrides(tmp_path):
    settings = load_config(write(tmp_path, BASE + "prometheus: {url: 'http://p:9090', dcgm_memory: true, "
                                            "queries: {queue_depth: 'sum(my_queue)'}}\n"))
    assert settings.queries["queue_depth"] == "sum(my_queue)"
    assert settings.queries["gpu_memory_headroom_ratio"] == DCGM_HEADROOM.replace("$selector", "")
    for preset in PRESETS:
        for promql in queries(preset, 'ns="x"').values():
            assert "$selector" not in promql and "{}" not in promql.replace('{ns="x"}', "")
    with pytest.raises(ValueError, match="unknown model-server preset"):
        queries("nope", "")
