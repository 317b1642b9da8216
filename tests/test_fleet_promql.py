"""The fleet's PromQL hub against Debian's Prometheus scraping an exporter of several models' vLLM series:
one HTTP query per signal per refresh, answers equal to each model's own queries, absent models named."""

import asyncio
import math
import time

import aiohttp
import pytest
from structlog.testing import capture_logs

from autoscaler.config import Settings
from autoscaler.errors import PermanentError, TransientError
from autoscaler.fleet.promql import FleetPrometheus, equality_matchers, fleet_query, fleet_template
from autoscaler.presets import PRESETS
from autoscaler.signals.prometheus import PrometheusSource
from loadtest.fleetexporter import fleet_exporter

from loadtest.realservers import instant_queries_answered
from servers import free_port, prometheus, query, wait_for_series

MODELS = 4


@pytest.fixture(scope="module")
def prom():
    with fleet_exporter(MODELS) as exporter, prometheus([exporter], honor_labels=True) as url:
        wait_for_series(url, 'sum(rate(vllm:request_success_total{app="model-3"}[1m]))', lambda v: v > 0)
        time.sleep(1.5)  # the tests read a second back: rate() has two scrapes there too
        yield url


def model(url: str, name: str, **prometheus_extra) -> Settings:
    return Settings(target={"namespace": "fleet", "name": name},
                    prometheus={"url": url, "selector": f'namespace="fleet",app="{name}"', **prometheus_extra})


def same(a, b) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-12)


def test_one_query_per_signal_and_the_answers_of_each_models_own_queries(prom):
    models = {("fleet", f"model-{i}"): model(prom, f"model-{i}") for i in range(MODELS)}
    models[("fleet", "silent")] = model(prom, "silent")  # no series at all
    now = time.time() - 1.0  # a time Prometheus has scraped past: both ways read the same data

    async def go():
        async with aiohttp.ClientSession() as session:
            hub = FleetPrometheus(session)
            before = instant_queries_answered(prom)
            with capture_logs() as logs:
                await hub.refresh(now, models)
            queries = instant_queries_answered(prom) - before
            fleet = {key: await hub.source(key).collect(now) for key in models}
            assert instant_queries_answered(prom) - before == queries  # collect serves the refreshed answers
            own = {key: await PrometheusSource(session, prom, s.queries, timeout_s=3.0).collect(now)
                   for key, s in models.items()}
            return hub, queries, fleet, own, logs

    hub, queries, fleet, own, logs = asyncio.run(go())
    assert queries == len(PRESETS["vllm"])
    for key in models:
        assert not fleet[key].errors and not own[key].errors
        assert fleet[key].samples.keys() == own[key].samples.keys()
        for name, sample in fleet[key].samples.items():
            assert same(sample.value, own[key].samples[name].value), (key, name)
            assert sample.at_s == pytest.approx(own[key].samples[name].at_s)
    assert len(fleet[("fleet", "model-2")].samples) == len(PRESETS["vllm"])
    assert fleet[("fleet", "model-2")].samples["queue_depth"].value == 1 + 2 % 5
    assert fleet[("fleet", "silent")].samples == {}  # missing, never zero
    assert hub.missing(("fleet", "silent")) == set(PRESETS["vllm"]) and not hub.missing(("fleet", "model-0"))
    named = [entry for entry in logs if "fleet/silent" in entry.get("models", [])]
    assert {entry["signal"] for entry in named} == set(PRESETS["vllm"])
    assert not any("fleet/model-0" in entry.get("models", []) for entry in logs)


def test_own_queries_and_other_selectors_are_queried_per_model(prom):
    custom = model(prom, "model-1", queries={"queue_depth": 'sum(vllm:num_requests_waiting{app="model-1"}) * 10'})
    wider = Settings(target={"namespace": "fleet", "name": "model-2"},
                     prometheus={"url": prom, "selector": 'namespace="fleet",app=~"model-2|model-3"'})
    models = {("fleet", "model-1"): custom, ("fleet", "model-2"): wider}
    now = time.time() - 1.0

    async def go():
        async with aiohttp.ClientSession() as session:
            hub = FleetPrometheus(session)
            before = instant_queries_answered(prom)
            await hub.refresh(now, models)
            refreshed = instant_queries_answered(prom) - before
            return refreshed, {key: await hub.source(key).collect(now) for key in models}

    refreshed, fleet = asyncio.run(go())
    assert refreshed == len(PRESETS["vllm"]) - 1  # model-1's six preset signals; model-2 is not in a group
    assert fleet[("fleet", "model-1")].samples["queue_depth"].value == 10 * (1 + 1 % 5)
    assert fleet[("fleet", "model-1")].samples["in_flight"].value == 4 + 1 % 7
    assert fleet[("fleet", "model-2")].samples["queue_depth"].value == (1 + 2 % 5) + (1 + 3 % 5)


def test_a_failed_query_is_every_models_error():
    dead = f"http://127.0.0.1:{free_port()}"
    models = {("fleet", f"model-{i}"): model(dead, f"model-{i}") for i in range(3)}

    async def go():
        async with aiohttp.ClientSession() as session:
            hub = FleetPrometheus(session)
            await hub.refresh(time.time(), models)
            return [await hub.source(key).collect(time.time()) for key in models]

    for result in asyncio.run(go()):
        assert not result.samples and set(result.errors) == set(PRESETS["vllm"])
        assert all(isinstance(e, TransientError) for e in result.errors.values())


def test_a_model_not_refreshed_holds():
    async def go():
        async with aiohttp.ClientSession() as session:
            return await FleetPrometheus(session).source(("fleet", "new")).collect(time.time())

    result = asyncio.run(go())
    assert not result.samples and result.errors["signals"].kind == "not_refreshed"


def test_every_presets_fleet_queries_are_valid_promql(prom):
    from autoscaler.fleet.promql import Group

    for preset in PRESETS:
        for dcgm in (False, True):
            group = Group(prom, preset, 60.0, dcgm, "app")
            signals = set(PRESETS[preset]) | ({"gpu_memory_headroom_ratio"} if dcgm else set())
            for signal in signals:
                query(prom, fleet_query(group, signal, {"fleet", "other"}))  # raises on HTTP 400


def test_fleet_template_keeps_the_model_labels_in_every_aggregation():
    labels = ("namespace", "app")
    assert fleet_template("sum(x{$selector})", labels) == "sum by (namespace, app) (x{$selector})"
    assert fleet_template("histogram_quantile(0.99, sum by (le) (rate(b[1m])))", labels) == \
        "histogram_quantile(0.99, sum by (le, namespace, app) (rate(b[1m])))"
    assert fleet_template("tgi_request_generated_tokens_sum{a} + avg(y)", labels) == \
        "tgi_request_generated_tokens_sum{a} + avg by (namespace, app) (y)"
    with pytest.raises(ValueError):
        fleet_template("x{$selector}", labels)


def test_equality_matchers():
    assert equality_matchers('namespace="a", app="b\\"c"') == {"namespace": "a", "app": 'b\\"c'}
    assert equality_matchers('namespace="a",app=~"b"') is None
    assert equality_matchers("garbage") is None
    assert equality_matchers("") == {}


def test_a_bad_answer_is_a_permanent_error_of_the_signal():
    from autoscaler.signals.prometheus import series_sample

    with pytest.raises(PermanentError):
        series_sample({"value": ["x"]}, "q")
