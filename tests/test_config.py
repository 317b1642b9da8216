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
    ("policy: {tick_s: 0}\n", r"field 'policy.tick_s'.*greater than or equal to 1.*got 0"),
    ("tick_s: 10\n", r"field 'tick_s': set the loop's period as policy.tick_s"),
    ("policy: {tick_s: 10}\ntick_deadline_s: 12\n", r"tick_deadline_s \(12.0\) must not exceed policy.tick_s"),
    ("model_server: llamacpp\n", r"model_server 'llamacpp' is not one of"),
    ("policy: {min_replicas: 5, max_replicas: 2}\n", r"min_replicas \(5\) must not exceed max_replicas \(2\)"),
    ("leader_election: {lease_duration_s: 5, renew_deadline_s: 10}\n", r"renew_deadline_s \(10.0\) < lease_duration_s"),
    ("admission: {default_priority: gold}\n", r"default_priority 'gold'"),
    ("surprise: 1\n", r"surprise"),
    ("policy: {tick_s: 1.0e-6}\n", r"field 'policy.tick_s'.*greater than or equal to 1 \(got 1e-06\)"),
    ("policy: {priorities: {}}\n", r"field 'policy.priorities'.*at least 1 item"),
    ("prometheus: {url: 'not a url'}\n", r"field 'prometheus.url'.*http\(s\) URL.*\(got 'not a url'\)"),
    ("prometheus: {url: 'prom:9090'}\n", r"field 'prometheus.url'.*\(got 'prom:9090'\)"),
    ("prometheus: {url: 'http://p:9090', queries: {queue_depht: 'sum(q)'}}\n",
     r"field 'prometheus.queries'.*unknown signal 'queue_depht'; did you mean 'queue_depth'"),
    ("prometheus: {url: 'http://p:9090', queries: {arrival_rate_gold: 'sum(q)'}}\n",
     r"unknown signal 'arrival_rate_gold'"),
    ("mode: shadow\x1f\n", r"config\.yaml: not valid YAML: character 0x1f at offset \d+: special characters"),
    ("2023-13-45: 1\n", r"config\.yaml: not valid YAML: month must be in 1\.\.12"),
    ("1: 2\n", r"config\.yaml: key 1: expected a field name"),
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


def test_per_class_arrival_queries_name_a_class_of_the_policy(tmp_path):
    settings = load_config(write(tmp_path, BASE + "prometheus: {url: 'http://p:9090/', queries: "
                                            "{arrival_rate_critical: 'sum(c)'}}\n"))
    assert settings.queries["arrival_rate_critical"] == "sum(c)"


def test_an_empty_url_from_the_environment_is_refused_naming_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOSCALER_PROMETHEUS__URL", "")
    with pytest.raises(ConfigError, match=r"^environment variable AUTOSCALER_PROMETHEUS__URL: field 'prometheus.url'"):
        load_config(write(tmp_path, BASE))


def test_errors_name_the_environment_variable_not_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOSCALER_POLICY__MAX_REPLICAS", "lots")
    path = write(tmp_path, BASE + "policy: {tick_s: 0}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    lines = str(caught.value).splitlines()
    assert any(line.startswith("environment variable AUTOSCALER_POLICY__MAX_REPLICAS: field 'policy.max_replicas'")
               and "(got 'lots')" in line for line in lines), lines
    assert any(line.startswith(f"{path}: field 'policy.tick_s'") for line in lines), lines


def test_a_check_across_file_and_environment_names_both(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOSCALER_POLICY__MAX_REPLICAS", "2")
    path = write(tmp_path, BASE + "policy: {min_replicas: 5}\n")
    with pytest.raises(ConfigError, match=rf"^{path} with environment variable AUTOSCALER_POLICY__MAX_REPLICAS: "
                                          r"field 'policy': .*min_replicas \(5\) must not exceed max_replicas \(2\)"):
        load_config(path)


@pytest.mark.parametrize("var,value", [
    ("AUTOSCALER_TARGET", "{oops"),
    ("AUTOSCALER_POLICY__PRIORITIES", "{critical: 1}"),
])
def test_invalid_json_in_a_variable_names_the_variable(tmp_path, monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    monkeypatch.setenv("AUTOSCALER_TARGET__NAME", "plain-text-is-fine")
    with pytest.raises(ConfigError, match=rf"^environment variable {var}: not valid JSON .*got '{value}'"):
        load_config(write(tmp_path, BASE))


def test_a_binary_config_is_refused_naming_file_and_line(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_bytes(b"target: {namespace: llm, name: m}\n\xff\xfe\x00\x81\n")
    with pytest.raises(ConfigError, match=rf"^{path}:2: not UTF-8 text: byte 0xff at column 1"):
        load_config(path)


FLEET = "fleet: {enabled: true, decision: %s}\nprometheus: {url: 'http://prom:9090'}\n"


@pytest.mark.parametrize("decision,capacity,match", [
    ("{levels: [[0, premium]]}", "{max_gpus: 8}", r"field 'fleet.decision'.*levels name classes \['premium'\]"),
    ("{levels: [[0, critical], [0, critical]]}", "{max_gpus: 8}", r"named twice"),
    ("{levels: [[-1, critical]]}", "{max_gpus: 8}", r"field 'fleet.decision.levels.0.0'"),
    ("{warm_after: soon}", "{max_gpus: 8}", r"warm_after = 'soon'"),
    ("{zero_wake_slots: 2}", "{}", r"fleet.decision is set but no GPU cap is"),
])
def test_a_fleet_decision_that_cannot_apply_is_refused_naming_why(tmp_path, decision, capacity, match):
    with pytest.raises(ConfigError, match=match):
        load_config(write(tmp_path, FLEET % decision + f"capacity: {capacity}\n"))


def test_a_fleet_decision_outside_fleet_mode_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="fleet.decision is set but fleet.enabled is not"):
        load_config(write(tmp_path, BASE + "fleet: {decision: {zero_wake_slots: 0}}\n"))


def test_the_fleet_decisions_defaults_are_the_policys(tmp_path):
    from autoscaler.config import FleetDecision
    from policies.fleet import FleetSpec

    assert FleetDecision().spec() == FleetSpec()
    settings = load_config(write(tmp_path, FLEET % "{levels: [[1, critical]], warm_after: tier}"
                                 + "capacity: {max_gpus: 8}\n"))
    assert settings.fleet.decision.spec() == FleetSpec(levels=((1, "critical"),), warm_after="tier")
