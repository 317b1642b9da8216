"""The fleet's stand-in for the model's Service (`loadtest.fleet.ServiceStandIn`), which the gateway's upstream
list holds while no pod is Ready: a request sent to it while the model is at zero (a held one, released by
an nginx worker that still has that list) reaches the server that came up since; with no server it is
refused, as by a Service without endpoints."""

import asyncio

import aiohttp
import pytest

from loadtest.fakeserver import FakeModelServer, RunningServer
from loadtest.fleet import ServiceStandIn
from loadtest.realservers import free_port


def test_the_stand_in_forwards_to_a_live_server_and_refuses_without_one():
    async def scenario():
        servers: dict[str, RunningServer] = {}
        service = ServiceStandIn(servers, free_port())
        await service.start()
        url = f"http://127.0.0.1:{service.port}/v1/completions"
        body = {"model": "fake-model", "prompt": "a b c", "max_tokens": 2}
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientConnectorError):  # refused, not accepted and closed
                async with session.post(url, json=body) as response:
                    await response.read()
            server = RunningServer(FakeModelServer(concurrency=2, time_scale=0.001), "127.0.0.1", free_port())
            await server.start()
            servers["pod-a"] = server
            await service.follow()
            try:
                async with session.post(url, json=body, headers={"Connection": "close"}) as response:
                    assert response.status == 200
                    assert (await response.json())["usage"]["completion_tokens"] == 2
            finally:
                await server.drain()
        servers.clear()
        await service.follow()
        assert service.listener is None

    asyncio.run(scenario())
