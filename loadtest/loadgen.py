"""An open-loop load generator: replays requests against the gateway on the trace's own (compressed) clock
and records what became of every one.

    python -m loadtest.loadgen --requests REQUESTS.jsonl --url http://127.0.0.1:PORT --factor 10 --out RECORDS.jsonl

Each request line: `{"i", "t_s", "class", "input_tokens", "output_tokens"}` (time at factor 1). Request i is
sent at t_s / factor after the start whatever happened to the others (open loop: a slow server does not
slow the offered load), as an OpenAI completion with the priority header. Each record line:
`{"i", "class", "sent_s", "late_s", "status", "queue_s", "latency_s", "retry_after", "shed_reason",
"gateway_hold_s", "error"}`, times at factor 1: `queue_s` is the server's `x-queue-seconds` (time waiting for
a slot), `latency_s` the whole exchange, `retry_after` the answer's Retry-After header (None without one),
`shed_reason` its X-Shed-Reason (why the admission endpoint rejected it; None without one), `gateway_hold_s`
the gateway's X-Held-Seconds (how long it held the request while the model woke from zero; None for a request
it did not hold); status 429 is a request the gateway shed, 503 with Retry-After one it held for a replica
that did not come within the hold; status 0 with an error is a request that got no answer.

With `--priority-in-body` the body also carries vLLM's `priority` field for the class (`BODY_PRIORITY`:
critical 0, standard 1, sheddable 2; lower is served first by a server run with `--scheduling-policy
priority`). It is what the gateway would set from the class; off by default because a vLLM server in its
default `fcfs` policy rejects any priority but 0.

With `--model NAMESPACE/NAME` every request carries `x-model-autoscaler: NAMESPACE/NAME`: the model it is for,
as a gateway's route for that model would name it (a fleet behind one gateway; `loadtest.gateway`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from autoscaler.fleet.routing import MODEL_HEADER

PRIORITY_HEADER = "x-request-priority"
# vLLM's per-request `priority` for each class: lower is served earlier under `--scheduling-policy priority`.
BODY_PRIORITY = {"critical": 0, "standard": 1, "sheddable": 2}


@dataclass(frozen=True)
class Request:
    i: int
    t_s: float
    cls: str
    input_tokens: int
    output_tokens: int

    def to_json(self) -> dict:
        return {"i": self.i, "t_s": self.t_s, "class": self.cls, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens}

    @classmethod
    def from_json(cls, d: dict) -> "Request":
        return cls(int(d["i"]), float(d["t_s"]), str(d["class"]), int(d["input_tokens"]), int(d["output_tokens"]))


def completion_body(request: Request, *, priority_in_body: bool = False) -> dict:
    """The OpenAI completion for a request; with `priority_in_body`, vLLM's `priority` of its class (a class
    not in BODY_PRIORITY gets the lowest priority there is)."""
    body = {"model": "fake-model", "prompt": [0] * request.input_tokens, "max_tokens": request.output_tokens}
    if priority_in_body:
        body["priority"] = BODY_PRIORITY.get(request.cls, max(BODY_PRIORITY.values()))
    return body


def _held_seconds(header: str | None, factor: float) -> float | None:
    """X-Held-Seconds (nginx's `$upstream_response_time` of the hold's subrequest) at factor 1; None without the
    header. nginx lists one time per upstream tried ("0.300, 0.001"; "-" for one that never answered): their
    sum, 0.0 when none is a number (held, for no time it could measure)."""
    if header is None:
        return None
    total = 0.0
    for part in header.replace(":", ",").split(","):
        try:
            total += float(part)
        except ValueError:
            pass
    return total * factor


async def _one(session: aiohttp.ClientSession, url: str, request: Request, *, factor: float, start: float,
               timeout: aiohttp.ClientTimeout, priority_in_body: bool = False, model: str | None = None) -> dict:
    sent = time.monotonic()
    record = {"i": request.i, "class": request.cls, "sent_s": (sent - start) * factor,
              "late_s": max(0.0, (sent - start) * factor - request.t_s), "status": 0, "queue_s": None,
              "latency_s": None, "retry_after": None, "shed_reason": None, "gateway_hold_s": None, "error": None}
    body = completion_body(request, priority_in_body=priority_in_body)
    headers = {PRIORITY_HEADER: request.cls, **({MODEL_HEADER: model} if model else {})}
    try:
        async with session.post(f"{url}/v1/completions", json=body, headers=headers,
                                timeout=timeout) as response:
            await response.read()
            record["status"] = response.status
            record["retry_after"] = response.headers.get("Retry-After")
            record["shed_reason"] = response.headers.get("X-Shed-Reason")
            record["gateway_hold_s"] = _held_seconds(response.headers.get("X-Held-Seconds"), factor)
            queued = response.headers.get("x-queue-seconds")
            if queued is not None:
                record["queue_s"] = float(queued) * factor
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
    record["latency_s"] = (time.monotonic() - sent) * factor
    return record


async def replay(requests: list[Request], url: str, *, factor: float, out: Path,
                 timeout_s: float = 3600.0, start_at: float | None = None, priority_in_body: bool = False,
                 model: str | None = None) -> None:
    """Send every request on schedule; write one record per request (in completion order) to `out`.
    `start_at`: the wall-clock time (unix seconds) of t = 0, shared with whoever watches the run."""
    timeout = aiohttp.ClientTimeout(total=timeout_s / factor)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)  # a connection per request, like many clients
    pending: set[asyncio.Task] = set()
    with out.open("w") as sink:
        def done(task: asyncio.Task) -> None:
            pending.discard(task)
            sink.write(json.dumps(task.result()) + "\n")

        async with aiohttp.ClientSession(connector=connector) as session:
            start = time.monotonic()
            if start_at is not None:
                start += start_at - time.time()
            for request in sorted(requests, key=lambda r: r.t_s):
                delay = start + request.t_s / factor - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(_one(session, url, request, factor=factor, start=start, timeout=timeout,
                                                    priority_in_body=priority_in_body, model=model))
                pending.add(task)
                task.add_done_callback(done)
            while pending:
                await asyncio.gather(*list(pending))


def read_requests(path: Path) -> list[Request]:
    return [Request.from_json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def write_requests(path: Path, requests: list[Request]) -> None:
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in requests))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.loadgen", description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=Path, required=True)
    p.add_argument("--url", required=True, help="the gateway")
    p.add_argument("--factor", type=float, default=1.0, help="time compression")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--start-at", type=float, default=None, help="unix time of t = 0 (default: now)")
    p.add_argument("--priority-in-body", action="store_true",
                   help="send vLLM's `priority` field for the class (for --scheduling-policy priority; default: off)")
    p.add_argument("--model", default=None, metavar="NAMESPACE/NAME",
                   help="name the model in x-model-autoscaler on every request (a fleet's gateway; default: none)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    asyncio.run(replay(read_requests(args.requests), args.url, factor=args.factor, out=args.out,
                       start_at=args.start_at, priority_in_body=args.priority_in_body, model=args.model))


if __name__ == "__main__":
    main()
