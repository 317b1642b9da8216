"""A fleet of fake model servers that follows the model Deployment: one server per Ready pod, at the pod's IP.

    python -m loadtest.fleet --kubeconfig FILE --namespace NS --selector app=model --port 8000 \
        [--concurrency 16] [--time-scale 0.1] [--targets-file F.json] [--upstreams-file F.conf] \
        [--nginx-pid-file F.pid] [--events-file F.jsonl] [--scheduling-policy {fcfs,priority}]

kwok gives pods IPs from a loopback range (the control plane runs it with `--cidr 127.X.0.0/16`), so a
server bound to a pod's IP is reached exactly where the controller's scrape and queue probe look for it.
The fleet lists the Deployment's pods on every change its watch of them reports, and every `poll_s` (for a
watch that ends or fails): a Ready pod with an IP gets a server; a pod that is
deleted (or being deleted, or no longer Ready) leaves the gateway's list at once and, `drain_delay_s`
later (a preStop sleep, while the gateway's reload takes effect), its server drains: it refuses new
connections and finishes what it has. After each change the fleet rewrites Prometheus' file_sd targets and
nginx's upstream list, and asks nginx to reload (SIGHUP), so the gateway balances over the live servers.
Each start and drain is one JSON line in `--events-file`.

With `--service-port`, while no pod is Ready the gateway's list holds a stand-in for the model's Service
(kube-proxy) on 127.0.0.1 instead of a refusing address: it forwards each connection to the live server
with the fewest connections it has open to it (IPVS's least-connection; the requests a server counts break
ties), and listens only while there is one (a Service without endpoints refuses the
connection: kube-proxy rejects it), so the gateway sees a refused connection, as in a cluster. A request
the gateway held while the model was at zero was accepted by an nginx worker that keeps the list of its
time (a reload starts new workers; the old ones finish what they have); through the stand-in it reaches the
replica that released it, as it would through a Service in a cluster. With `--service-only` as well, the
gateway's list holds the stand-in at all times (a gateway whose upstream is the model's Service, as the
shipped one): every request goes through one least-connection count over the live servers, where nginx's
`least_conn` over the pods counts each worker's own connections only, and each reload (a pod turning Ready)
starts workers that count from zero while the old ones release their held requests to the servers of their
own, older list.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from kubernetes_asyncio import client, config, watch

from autoscaler.kube.pods import pod_facts
from loadtest.fakeserver import SCHEDULING_POLICIES, FakeModelServer, RunningServer

# The upstream list may not be empty: a server that refuses connections stands in while no pod is Ready.
NO_SERVER = "server 127.0.0.1:9 max_fails=0;  # no Ready pod\n"


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


class ServiceStandIn:
    """The model's Service at zero: each connection forwarded to the least busy live server (see above)."""

    def __init__(self, servers: dict[str, RunningServer], port: int) -> None:
        self.servers, self.port = servers, port
        self.listener: asyncio.Server | None = None
        self.open: collections.Counter[str] = collections.Counter()  # connections forwarded and open, per pod

    @property
    def upstream(self) -> str:
        return f"server 127.0.0.1:{self.port} max_fails=0;  # no Ready pod: the Service\n"

    async def start(self) -> None:
        await self.follow()

    async def follow(self) -> None:
        """Listen while a server is live, else refuse connections (closed, as a Service without endpoints)."""
        live = any(not s.draining for s in self.servers.values())
        if live and self.listener is None:
            self.listener = await asyncio.start_server(self._forward, "127.0.0.1", self.port)
        elif not live and self.listener is not None:
            self.listener.close()
            self.listener = None

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        live = [name for name, s in self.servers.items() if not s.draining]
        if not live:
            writer.close()  # accepted just before the last server went: closed unanswered
            return
        # least connections as the Service counts them (its own, open): a server counts a request only once
        # its bytes arrive, so a burst of connections would all pick the server that was idle when it began
        name = min(live, key=lambda n: (self.open[n], self.servers[n].server.in_flight))
        target = self.servers[name]
        self.open[name] += 1
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(target.host, target.port)
            except OSError:
                writer.close()
                return
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self.open[name] -= 1


@dataclass(frozen=True)
class PodView:
    name: str
    ip: str | None
    ready: bool
    deleting: bool

    @property
    def serving(self) -> bool:
        return self.ready and self.ip is not None and not self.deleting


def pod_view(pod) -> PodView:
    facts = pod_facts(pod)
    return PodView(facts.name, facts.ip, facts.ready, facts.deleting)


class Fleet:
    def __init__(self, api: client.CoreV1Api, *, namespace: str, selector: str, port: int, concurrency: int,
                 time_scale: float, targets_file: Path | None = None, upstreams_file: Path | None = None,
                 nginx_pid_file: Path | None = None, events_file: Path | None = None, poll_s: float = 0.2,
                 drain_delay_s: float = 0.5, service_port: int | None = None,
                 target_labels: dict[str, str] | None = None, scheduling_policy: str = "fcfs",
                 service_only: bool = False) -> None:
        self.api, self.namespace, self.selector, self.port = api, namespace, selector, port
        self.concurrency, self.time_scale, self.poll_s = concurrency, time_scale, poll_s
        self.drain_delay_s, self.scheduling_policy = drain_delay_s, scheduling_policy
        self.targets_file, self.upstreams_file, self.nginx_pid_file = targets_file, upstreams_file, nginx_pid_file
        self.events = events_file.open("a") if events_file else None
        self.servers: dict[str, RunningServer] = {}  # pod name -> its server
        self.draining: set[asyncio.Task] = set()
        self.service = ServiceStandIn(self.servers, service_port) if service_port else None
        if service_only and self.service is None:
            raise ValueError("service_only needs a service_port: the stand-in the gateway's list holds")
        self.service_only = service_only
        self._upstreams_written = False
        # what a pod's Prometheus target is labelled with: its namespace, and e.g. its `app` label (several
        # models in one Prometheus, told apart as the fleet controller's grouped queries expect)
        self.target_labels = {"namespace": namespace, **(target_labels or {})}

    def _event(self, kind: str, pod: str, **fields) -> None:
        if self.events is not None:
            self.events.write(json.dumps({"t": time.time(), "event": kind, "pod": pod, **fields}) + "\n")
            self.events.flush()

    async def sync(self) -> bool:
        """One reconciliation; returns whether the set of servers changed."""
        pods = await self.api.list_namespaced_pod(self.namespace, label_selector=self.selector)
        views = {p.name: p for p in map(pod_view, pods.items)}
        changed = False
        for name in list(self.servers):
            view = views.get(name)
            if view is None or not view.serving:
                server = self.servers.pop(name)
                task = asyncio.create_task(self._drain(name, server))
                self.draining.add(task)
                task.add_done_callback(self.draining.discard)
                changed = True
        for name, view in views.items():
            if view.serving and name not in self.servers:
                server = RunningServer(FakeModelServer(concurrency=self.concurrency, time_scale=self.time_scale,
                                                       scheduling_policy=self.scheduling_policy), view.ip, self.port)
                try:
                    await server.start()
                except OSError as exc:  # the address is still held by a server draining on it: next round
                    self._event("start_failed", name, ip=view.ip, error=str(exc))
                    continue
                self.servers[name] = server
                self._event("started", name, ip=view.ip)
                changed = True
        if changed:
            if self.service is not None:
                await self.service.follow()
            self.publish()
        return changed

    async def _drain(self, name: str, server: RunningServer) -> None:
        await asyncio.sleep(self.drain_delay_s)  # out of the gateway's list first (see publish)
        in_flight = server.server.in_flight
        self._event("draining", name, in_flight=in_flight)
        await server.drain()
        self._event("drained", name, in_flight=in_flight)

    def publish(self) -> None:
        """Tell Prometheus and nginx which servers are live."""
        addresses = sorted(f"{s.host}:{s.port}" for s in self.servers.values())
        if self.targets_file is not None:
            _replace(self.targets_file, json.dumps([{"targets": addresses, "labels": self.target_labels}]))
        if self.upstreams_file is not None:
            empty = self.service.upstream if self.service is not None else NO_SERVER
            listed = "" if self.service_only else "".join(f"server {a} max_fails=0;\n" for a in addresses)
            if self.service_only and self._upstreams_written:
                return  # the stand-in at all times, written already: nothing for nginx to reload
            self._upstreams_written = True
            _replace(self.upstreams_file, listed or empty)
            if self.nginx_pid_file is not None and self.nginx_pid_file.exists():
                try:
                    os.kill(int(self.nginx_pid_file.read_text().strip()), signal.SIGHUP)
                except (ValueError, ProcessLookupError):
                    pass  # nginx not (yet) running: it reads the file when it starts

    async def _nudges(self, nudge: asyncio.Event) -> None:
        """Nudge the reconciliation on every change to the pods: a pod turning Ready gets its server at once,
        as a Ready pod's server is up in a cluster (its readiness probe passed), where the poll alone lagged
        it by up to `poll_s` (at factor 10, 2 s of the scenario, in which the gateway sent the requests meant
        for it to the other servers' queues). The poll stays, for a watch that ends or fails."""
        while True:
            stream = watch.Watch()
            try:
                async for _ in stream.stream(self.api.list_namespaced_pod, self.namespace,
                                             label_selector=self.selector, timeout_seconds=300):
                    nudge.set()
            except (client.exceptions.ApiException, OSError, asyncio.TimeoutError, ValueError) as exc:
                self._event("watch_failed", "", error=str(exc))
                await asyncio.sleep(self.poll_s)
            finally:
                await stream.close()

    async def run(self, stop: asyncio.Event) -> None:
        if self.service is not None:
            await self.service.start()
        self.publish()
        nudge = asyncio.Event()
        stopping = asyncio.create_task(stop.wait())
        stopping.add_done_callback(lambda _: nudge.set())
        nudges = asyncio.create_task(self._nudges(nudge))
        try:
            while not stop.is_set():
                nudge.clear()
                try:
                    await self.sync()
                except (client.exceptions.ApiException, OSError, asyncio.TimeoutError) as exc:
                    self._event("list_failed", "", error=str(exc))
                try:
                    await asyncio.wait_for(nudge.wait(), self.poll_s)
                except asyncio.TimeoutError:
                    pass
        finally:
            nudges.cancel()
            stopping.cancel()
        for name, server in list(self.servers.items()):  # the fleet stops: every server drains
            self.draining.add(asyncio.create_task(self._drain(name, server)))
        self.servers.clear()
        await asyncio.gather(*self.draining)


def _replace(path: Path, text: str) -> None:
    """Write atomically, so a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.fleet", description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--selector", required=True, help="the model Deployment's label selector, e.g. app=model")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--time-scale", type=float, default=1.0, help="every duration times this (1 / compression)")
    p.add_argument("--poll-s", type=float, default=0.2)
    p.add_argument("--drain-delay-s", type=float, default=0.5, help="out of the gateway this long before draining")
    p.add_argument("--targets-file", type=Path, default=None, help="Prometheus file_sd JSON to keep current")
    p.add_argument("--upstreams-file", type=Path, default=None, help="nginx upstream servers to keep current")
    p.add_argument("--nginx-pid-file", type=Path, default=None, help="nginx master to SIGHUP after a change")
    p.add_argument("--events-file", type=Path, default=None)
    p.add_argument("--service-port", type=int, default=None,
                   help="while no pod is Ready, a stand-in for the model's Service on this port (default: none)")
    p.add_argument("--service-only", action="store_true",
                   help="with --service-port: the gateway's list holds the stand-in at all times, as a gateway "
                        "whose upstream is the model's Service (default: the pods, the stand-in only at zero)")
    p.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, default="fcfs",
                   help="each server's queue order, as vLLM's --scheduling-policy (default: fcfs)")
    p.add_argument("--target-label", action="append", default=[], metavar="KEY=VALUE",
                   help="a label of every Prometheus target besides namespace (repeatable; default: none)")
    args = p.parse_args(argv)
    if args.service_only and args.service_port is None:
        p.error("--service-only needs --service-port")
    try:
        args.target_labels = dict(item.split("=", 1) for item in args.target_label)
    except ValueError:
        p.error(f"--target-label takes KEY=VALUE, got {args.target_label}")
    return args


async def _main(args: argparse.Namespace) -> None:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=args.kubeconfig, client_configuration=configuration)
    async with client.ApiClient(configuration=configuration) as api:
        fleet = Fleet(client.CoreV1Api(api), namespace=args.namespace, selector=args.selector, port=args.port,
                      concurrency=args.concurrency, time_scale=args.time_scale, targets_file=args.targets_file,
                      upstreams_file=args.upstreams_file, nginx_pid_file=args.nginx_pid_file,
                      events_file=args.events_file, poll_s=args.poll_s, drain_delay_s=args.drain_delay_s,
                      service_port=args.service_port, target_labels=args.target_labels,
                      scheduling_policy=args.scheduling_policy, service_only=args.service_only)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await fleet.run(stop)


def main(argv: list[str] | None = None) -> None:
    asyncio.run(_main(parse_args(argv)))


if __name__ == "__main__":
    main()
