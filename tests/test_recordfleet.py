"""The bundled recording and the tool that made it: the stretch back to real time, and the recording replays."""

import json
import math

from autoscaler.replay.openloop import open_loop
from autoscaler.replay.recording import read_recording
from loadtest.recordfleet import at_factor_one
from policies import PolicySpec

from helpers import ROOT

BUNDLED = ROOT / "loadtest" / "recordings" / "fleet-3h"


def _doc(name, values):
    return {name: {"status": "success", "data": {"resultType": "matrix",
                                                 "result": [{"metric": {}, "values": values}]}}}


def test_at_factor_one_stretches_times_divides_rates_and_multiplies_durations():
    doc = {**_doc("arrival_rate_per_s", [[100.0, "50"], [101.5, "NaN"]]),
           **_doc("service_time_s", [[100.0, "1.0"]]), **_doc("queue_depth", [[101.5, "7"]])}
    out = at_factor_one(doc, start_s=100.0, factor=10.0)
    rate = out["arrival_rate_per_s"]["data"]["result"][0]["values"]
    assert rate[0] == [100.0, "5"] and rate[1][0] == 115.0 and math.isnan(float(rate[1][1]))
    assert out["service_time_s"]["data"]["result"][0]["values"] == [[100.0, "10"]]
    assert out["queue_depth"]["data"]["result"][0]["values"] == [[115.0, "7"]]


def test_the_bundled_recording_is_three_hours_small_and_replays():
    assert (BUNDLED / "recording.json").stat().st_size + (BUNDLED / "compressed.json").stat().st_size < 1_000_000
    recording = read_recording(BUNDLED / "recording.json")
    assert 2.9 < (recording.end_s - recording.start_s) / 3600 < 3.1
    rows = open_loop(recording, PolicySpec())
    assert all(r["valid"] for r in rows) and len({r["replicas"] for r in rows}) > 3
    assert set(json.loads((BUNDLED / "compressed.json").read_text())) == set(recording.series)
