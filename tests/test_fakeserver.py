"""The fake model server behaves like vLLM where the autoscaler can tell: slots, a queue (FCFS, or by
priority as vLLM's `--scheduling-policy priority`), time per token, vLLM's metric names, and a drain that
finishes what it has and takes nothing new."""

import asyncio

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadtest.fakeserver import FakeModelServer, RunningServer, Slots, prompt_tokens

from servers import free_port


def completion(session, url, prompt, out):
    return session.post(f"{url}/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": out})


def test_prompt_tokens_follow_the_openai_forms():
    assert prompt_tokens([1, 2, 3]) == 3 and prompt_tokens("one two three four") == 4
    assert prompt_tokens(["a b", "c"]) == 3
    with pytest.raises(ValueError):
        prompt_tokens({"text": "x"})


def test_slots_fcfs_queue_token_time_and_metric_names():
    """Two slots, six requests of 0.2 s (prefill 0 + 10 tokens x 20 ms) arriving 10 ms apart: they are
    served in arrival order, two at a time, as in the simulator's FCFS model. Request 2 takes the slot
    request 0 frees at 0.2 s after arriving at 0.02 s: it waits 0.18 s; request 4 waits 0.36 s."""

    async def go():
        server = RunningServer(FakeModelServer(concurrency=2, prefill_s_per_token=0.0, decode_s_per_token=0.02),
                               "127.0.0.1", free_port())
        await server.start()
        async with aiohttp.ClientSession() as session:
            async def one(i):
                await asyncio.sleep(0.01 * i)  # arrival order 0..5
                async with completion(session, server.url, [7] * 5, 10) as response:
                    body = await response.json()
                    return i, float(response.headers["x-queue-seconds"]), body["usage"]

            results = await asyncio.gather(*(one(i) for i in range(6)))
            async with session.get(f"{server.url}/metrics") as response:
                text = await response.text()
            async with completion(session, server.url, {"bad": 1}, 1) as response:
                bad = response.status
        await server.drain()
        return results, text, bad

    results, text, bad = asyncio.run(go())
    for i, queued, usage in results:
        assert usage == {"prompt_tokens": 5, "completion_tokens": 10, "total_tokens": 15}
        assert queued == pytest.approx((i // 2) * 0.18, abs=0.03)
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["vllm:request_success_total"] == 6 and samples["vllm:generation_tokens_total"] == 60
    assert samples["vllm:prompt_tokens_total"] == 30
    assert samples["vllm:num_requests_waiting"] == 0 and samples["vllm:num_requests_running"] == 0
    for name in ("vllm:kv_cache_usage_perc", "vllm:e2e_request_latency_seconds_count",
                 "vllm:request_queue_time_seconds_count", "vllm:request_inference_time_seconds_sum",
                 "vllm:time_to_first_token_seconds_count"):
        assert name in samples
    assert samples["vllm:request_inference_time_seconds_sum"] == pytest.approx(6 * 0.2, rel=0.01)
    assert bad == 400


def test_drain_finishes_what_it_has_and_refuses_new_connections():
    async def go():
        server = RunningServer(FakeModelServer(concurrency=1, prefill_s_per_token=0.0, decode_s_per_token=0.05),
                               "127.0.0.1", free_port())
        await server.start()
        async with aiohttp.ClientSession() as session:
            async def one():
                async with completion(session, server.url, "x", 4) as response:  # 0.2 s each, one slot
                    return response.status

            taken = [asyncio.create_task(one()) for _ in range(3)]  # one running, two waiting
            await asyncio.sleep(0.05)
            drain = asyncio.create_task(server.drain())
            await asyncio.sleep(0.05)
            try:
                async with completion(session, server.url, "x", 1) as response:
                    late = response.status
            except aiohttp.ClientConnectionError:
                late = "refused"
            statuses = await asyncio.gather(*taken)
            await drain
        return statuses, late

    statuses, late = asyncio.run(go())
    assert statuses == [200, 200, 200] and late == "refused"


def serve_order(policy, priorities):
    """One slot held by a first request for 0.3 s; then requests with `priorities` arrive 20 ms apart and
    queue. Returns the indices in the order they got the slot (by their queue wait)."""

    async def go():
        server = RunningServer(FakeModelServer(concurrency=1, prefill_s_per_token=0.0, decode_s_per_token=0.03,
                                               scheduling_policy=policy), "127.0.0.1", free_port())
        await server.start()
        async with aiohttp.ClientSession() as session:
            async def one(i, priority, out, delay_s):
                await asyncio.sleep(delay_s)
                body = {"model": "m", "prompt": "x", "max_tokens": out}
                if priority is not None:
                    body["priority"] = priority
                async with session.post(f"{server.url}/v1/completions", json=body) as response:
                    assert response.status == 200, await response.text()
                    return i, float(response.headers["x-queue-seconds"])

            first = asyncio.create_task(one(-1, None, 10, 0.0))
            rest = [one(i, p, 2, 0.05 + 0.02 * i) for i, p in enumerate(priorities)]
            waits = await asyncio.gather(first, *rest)
        await server.drain()
        return [i for i, _ in sorted(waits[1:], key=lambda w: w[1])]

    return asyncio.run(go())


def test_priority_policy_serves_a_later_critical_request_before_earlier_sheddable_ones():
    """vLLM's `--scheduling-policy priority`: the queue is served by (priority, arrival), lower first; the
    critical request (0) arriving last is served first, then the standard one (1), then the sheddable
    ones (2) in arrival order."""
    assert serve_order("priority", [2, 2, 1, 2, 0]) == [4, 2, 0, 1, 3]


def test_fcfs_policy_serves_in_arrival_order_and_rejects_a_priority_as_vllm_does():
    assert serve_order("fcfs", [None, None, None, 0, 0]) == [0, 1, 2, 3, 4]

    async def go():
        server = RunningServer(FakeModelServer(concurrency=1), "127.0.0.1", free_port())
        await server.start()
        async with aiohttp.ClientSession() as session:
            statuses = []
            for priority in (2, "high", 1.5):
                body = {"model": "m", "prompt": "x", "max_tokens": 1, "priority": priority}
                async with session.post(f"{server.url}/v1/completions", json=body) as response:
                    statuses.append(response.status)
        await server.drain()
        return statuses

    assert asyncio.run(go()) == [400, 400, 400]
    with pytest.raises(ValueError):
        FakeModelServer(scheduling_policy="lifo")


def test_a_cancelled_waiter_gives_its_turn_to_the_next():
    async def go():
        slots = Slots(1)
        await slots.acquire()
        order = []

        async def wait(name, key):
            await slots.acquire(key)
            order.append(name)
            slots.release()

        gone = asyncio.create_task(wait("gone", 0))
        kept = asyncio.create_task(wait("kept", 1))
        await asyncio.sleep(0.01)
        gone.cancel()
        await asyncio.sleep(0.01)
        slots.release()
        await kept
        return order, slots.free

    assert asyncio.run(go()) == (["kept"], 1)
