"""The admission endpoint alone in a process of its own, for the gateway tests that kill, stop and restart
it: `python tests/admission_process.py PORT SHED` serves one decision shedding SHED (JSON, e.g.
{"sheddable": 0.5}) on 127.0.0.1:PORT until killed; `... PORT SHED zero`: the model at zero (no replica
Ready), so every request is held."""

from __future__ import annotations

import asyncio
import json
import sys

from aiohttp import web

from autoscaler.admission import Admission
from autoscaler.board import DecisionBoard, Published
from policies import PRIORITY_CLASSES, Decision


async def serve(port: int, shed: dict[str, float], zero: bool = False) -> None:
    board = DecisionBoard()
    ready = 0 if zero else None
    await board.publish(Published(Decision(replicas=4, shed=shed), 4, None, 0.0, ready_replicas=ready))
    admission = Admission(board, priorities=dict(PRIORITY_CLASSES), header="x-request-priority",
                          default_class="standard", retry_after_s=7)
    runner = web.AppRunner(admission.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), json.loads(sys.argv[2]), zero=sys.argv[3:] == ["zero"]))
