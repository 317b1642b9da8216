"""The live queue probe behind the saturation guard, against real (fake vLLM) model servers."""

import asyncio

import aiohttp

from autoscaler.admission import Admission
from autoscaler.board import DecisionBoard, Published
from autoscaler.signals.queueprobe import QueueProbe
from policies import PRIORITY_CLASSES, Decision

from servers import fake_model_server, free_port, post_json


class Static:
    def __init__(self, pods):
        self.pods = pods

    async def endpoints(self):
        return dict(self.pods)


def test_probe_sums_pods_drives_the_guard_and_never_reports_partial_sums():
    with fake_model_server() as a, fake_model_server() as b:
        post_json(f"{a}/admin/state", {"waiting": 30})
        post_json(f"{b}/admin/state", {"waiting": 25})
        pods = Static({"a": f"{a}/metrics", "b": f"{b}/metrics"})

        async def go():
            board = DecisionBoard()
            # the last tick saw an empty queue; the burst arrived since
            decision = Decision(replicas=4, saturation_queue_depth={"sheddable": 40, "standard": 60})
            await board.publish(Published(decision, 4, 0.0, 0.0))
            async with aiohttp.ClientSession() as session:
                probe = QueueProbe(session, pods, "vllm:num_requests_waiting", interval_s=0.2)
                unknown = probe.current()
                await probe.sample_once()
                total = probe.current()
                admission = Admission(board, priorities=dict(PRIORITY_CLASSES), header="p", default_class="standard",
                                      retry_after_s=1, live_queue=probe.current)
                verdicts = {c: admission.decide(c) for c in PRIORITY_CLASSES}
                pods.pods["dead"] = f"http://127.0.0.1:{free_port()}/metrics"
                probe._endpoints_at = None
                await probe.sample_once()  # one pod unreadable: no partial sum is published
                kept = probe.current()
                await asyncio.sleep(0.7)  # three intervals on, the last good reading is too old to use
                return unknown, total, verdicts, kept, probe.current()

        unknown, total, verdicts, kept, stale = asyncio.run(go())
    assert unknown is None and total == 55
    assert verdicts["sheddable"] is not None and "saturated" in verdicts["sheddable"]
    assert verdicts["standard"] is None and verdicts["critical"] is None
    assert kept == 55 and stale is None
