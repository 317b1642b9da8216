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


def test_a_burst_through_the_stand_in_spreads_over_the_live_servers():
    """Held requests released together reach the stand-in as a burst of connections. A server counts a request
    only once its bytes arrive, so choosing by that count alone sent a burst of 12 to one server (where a
    Service spreads them); the stand-in counts its own open connections, as IPVS's least-connection does."""
    async def scenario():
        servers: dict[str, RunningServer] = {}
        for name in ("pod-a", "pod-b", "pod-c"):
            servers[name] = RunningServer(FakeModelServer(concurrency=2, time_scale=0.1), "127.0.0.1", free_port())
            await servers[name].start()
        service = ServiceStandIn(servers, free_port())
        await service.start()
        url = f"http://127.0.0.1:{service.port}/v1/completions"
        body = {"model": "fake-model", "prompt": "a b c", "max_tokens": 100}  # 0.2 s each: all open at once
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as session:
                async def one() -> int:
                    async with session.post(url, json=body) as response:
                        await response.read()
                        return response.status

                statuses = await asyncio.gather(*(one() for _ in range(12)))
            served = {name: s.server._l(s.server.success)._value.get() for name, s in servers.items()}
        finally:
            for s in servers.values():
                await s.drain()
            servers.clear()
            await service.follow()
        assert statuses == [200] * 12
        assert served == {"pod-a": 4, "pod-b": 4, "pod-c": 4}
        assert not +service.open  # every forwarded connection closed and uncounted

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


@pytest.mark.parametrize("service_only", [False, True])
def test_with_service_only_the_gateways_list_is_the_stand_in_at_all_times(tmp_path, service_only):
    """`--service-only` (the scale-to-zero scenarios): the gateway's upstream list holds the stand-in with a pod
    Ready too, so every request goes through its one count of connections; without it the list names the pods.
    The list is written once: nothing for nginx to reload as pods come and go."""
    upstreams = tmp_path / "upstreams.conf"

    async def scenario():
        fleet = Fleet(_OnePod(), namespace="ns", selector="app=m", port=free_port(), concurrency=2,
                      time_scale=0.001, upstreams_file=upstreams, service_port=free_port(),
                      service_only=service_only)
        fleet.publish()
        written = upstreams.stat().st_ino  # each write replaces the file: a new inode
        try:
            assert await fleet.sync()
            return upstreams.read_text(), upstreams.stat().st_ino == written, fleet.service.upstream
        finally:
            await fleet.servers["pod-a"].drain()
            fleet.servers.clear()
            await fleet.service.follow()

    text, unchanged, stand_in = asyncio.run(scenario())
    assert (text == stand_in) is service_only and unchanged is service_only
    assert service_only or "127.0.0.1:" in text and "no Ready pod" not in text


def test_service_only_needs_the_stand_in():
    with pytest.raises(SystemExit):
        parse_args(["--kubeconfig", "k", "--namespace", "ns", "--selector", "app=m", "--service-only"])
    with pytest.raises(ValueError, match="service_port"):
        Fleet(_OnePod(), namespace="ns", selector="app=m", port=free_port(), concurrency=2, time_scale=0.001,
              service_only=True)


def test_a_pod_turning_ready_gets_its_server_at_once_not_at_the_next_poll(cluster, namespace):
    """Against the real apiserver, with kwok making the pod Ready: the fleet's watch of the pods starts its
    server within seconds, where its poll (every 60 s here) would come only after a minute."""
    from kubernetes_asyncio import client, config

    from loadtest.kube.controlplane import model_deployment

    async def scenario() -> float:
        configuration = client.Configuration()
        await config.load_kube_config(config_file=cluster.kubeconfig, client_configuration=configuration)
        async with client.ApiClient(configuration=configuration) as api:
            fleet = Fleet(client.CoreV1Api(api), namespace=namespace, selector="app=watched", port=free_port(),
                          concurrency=2, time_scale=0.001, poll_s=60.0)
            stop = asyncio.Event()
            running = asyncio.create_task(fleet.run(stop))
            await asyncio.sleep(1.0)  # the first listing is done: no pod yet
            status, body = cluster.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments",
                                           model_deployment(namespace, "watched", 1, ready_delay="1s"))
            assert status == 201, body
            created = asyncio.get_running_loop().time()
            while not fleet.servers and asyncio.get_running_loop().time() - created < 30.0:
                await asyncio.sleep(0.05)
            took = asyncio.get_running_loop().time() - created
            stop.set()
            await running
            return took

    assert asyncio.run(scenario()) < 15.0
