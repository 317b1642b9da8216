"""The fleet's servers get the scheduling policy it is given. The fleet's stand-in for the model's Service
(`loadtest.fleet.ServiceStandIn`), which the gateway's upstream
list holds while no pod is Ready: a request sent to it while the model is at zero (a held one, released by
an nginx worker that still has that list) reaches the server that came up since; with no server it is
refused, as by a Service without endpoints."""

import asyncio

import aiohttp
import pytest
from kubernetes_asyncio.client import V1ObjectMeta, V1Pod, V1PodCondition, V1PodList, V1PodStatus

from loadtest.fakeserver import FakeModelServer, RunningServer
from loadtest.fleet import Fleet, ServiceStandIn, parse_args
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


class _OnePod:
    """The Kubernetes API as the fleet reads it: one Ready pod at 127.0.0.1."""

    async def list_namespaced_pod(self, namespace, label_selector):
        return V1PodList(items=[V1Pod(metadata=V1ObjectMeta(name="pod-a", namespace=namespace),
                                      status=V1PodStatus(pod_ip="127.0.0.1", conditions=[
                                          V1PodCondition(type="Ready", status="True")]))])


@pytest.mark.parametrize("policy, status", [("priority", 200), ("fcfs", 400)])
def test_the_fleet_starts_its_servers_with_the_scheduling_policy_it_is_given(policy, status):
    """`--scheduling-policy priority` reaches every server the fleet starts: a request carrying vLLM's
    `priority` is served; a `fcfs` server refuses it, as vLLM does."""
    args = parse_args(["--kubeconfig", "k", "--namespace", "ns", "--selector", "app=m",
                       "--scheduling-policy", policy])

    async def scenario():
        fleet = Fleet(_OnePod(), namespace="ns", selector="app=m", port=free_port(), concurrency=2,
                      time_scale=0.001, scheduling_policy=args.scheduling_policy)
        assert await fleet.sync()
        server = fleet.servers["pod-a"]
        body = {"model": "fake-model", "prompt": "a b c", "max_tokens": 2, "priority": 2}
        try:
            async with aiohttp.ClientSession() as session:
                async with session.post(f"{server.url}/v1/completions", json=body) as response:
                    return response.status
        finally:
            await server.drain()

    assert asyncio.run(scenario()) == status
