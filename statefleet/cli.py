"""`statefleet`: the operator and its tools.

statefleet operator [--catalog FILE] [--namespace NS ...] [--install-crds]
statefleet crds           # print the CRDs generated from the models
statefleet catalog [--catalog FILE]   # the versions offered: each service's own, or yours
statefleet backups found --storage NAME [--import] [-n NS]   # backups in a bucket, with or without objects
statefleet rollout status|pause|resume|promote|abort|undo NAME [-n NS]
                          # also as `kubectl statefleet rollout ...` (the kubectl-statefleet script)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import socket
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx2
import kopf
import yaml
from lightkube import AsyncClient, Client, codecs
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

from backup import commands as backup_commands
from framework import credentials_command
from framework.instance_controller import InstanceController
from framework.kube import kopf_fixes, metrics
from framework.kube.leader import LeaderElector, LeadershipLost, Timing, standby_health
from framework.kube.meta import MANAGER
from framework.network_policy import NetworkPolicies, SettingsError
from framework.object_controller import ObjectController
from framework.rollout import commands as rollout_commands
from framework.rollout.controller import RolloutController
from framework.rollout.outbound import IN_CLUSTER
from statefleet.generate import render_crds
from statefleet.plugins import in_process_hooks, load_catalog, load_plugins, object_kinds, watched_kinds

CRDS_SERVED_WITHIN = 60.0


async def install_crds(client: AsyncClient) -> None:
    """Apply the CRDs, then wait until the API server serves every one. kopf resolves the
    resources it watches from discovery once at start, and again only when a CRD changes: a CRD
    that another operator created a moment before, still missing from discovery, would otherwise
    stay unwatched for good (seen with two operators started together)."""
    crds = [yaml.safe_load(text) for text in render_crds().values()]
    for crd in crds:
        await client.apply(codecs.from_dict(crd), field_manager=MANAGER, force=True)
    try:
        async with asyncio.timeout(CRDS_SERVED_WITHIN):
            for crd in crds:
                await client.wait(
                    CustomResourceDefinition, crd["metadata"]["name"], for_conditions=["Established"]
                )
            await wait_discovered(client, crds)
    except TimeoutError:
        raise SystemExit(f"the API server did not serve the CRDs within {CRDS_SERVED_WITHIN:.0f} s") from None


async def wait_discovered(client: AsyncClient, crds: list[dict[str, Any]]) -> None:
    http = client._client._client  # lightkube has no discovery call; its HTTP client has the auth
    for crd in crds:
        spec = crd["spec"]
        for version in (v["name"] for v in spec["versions"] if v.get("served", True)):
            while True:
                answer = await http.get(f"/apis/{spec['group']}/{version}")
                listed = answer.json().get("resources", []) if answer.status_code == 200 else []
                if any(r["name"] == spec["names"]["plural"] for r in listed):
                    break
                await asyncio.sleep(0.2)


async def run_operator(
    args: argparse.Namespace,
    stop_flag: threading.Event | None = None,
    ready_flag: threading.Event | None = None,
) -> None:
    """Every controller, until SIGTERM or SIGINT; or, run in a thread of another program (the
    controller tests), until `stop_flag` is set. `ready_flag` is set once the watches run."""
    kopf_fixes.apply()
    # A busy API server answers slowly rather than not at all: wait for it.
    client = AsyncClient(field_manager=MANAGER, timeout=httpx2.Timeout(60, connect=10))
    metrics.count_api_requests(client)
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    # Everything that needs no API comes before the Lease (plugins imported, controllers built):
    # a standby that takes over only starts its watches, seconds sooner on a busy node.
    network_policies = network_policy_settings(args)
    plugins = load_plugins()
    rollouts = RolloutController(client, in_process_hooks(plugins), args.allowed_destination or IN_CLUSTER)
    rollouts.register()
    catalog = load_catalog(plugins, Path(args.catalog) if args.catalog else None)
    instances = InstanceController(client, catalog, plugins, rollouts, args.job_image, network_policies)
    instances.register()
    objects = ObjectController(client, object_kinds(plugins, args.job_image), watched_kinds(plugins))
    objects.register()

    @kopf.on.startup()
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # Events are ours: one per transition, never repeated
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60
        # A worker task per watched object lingers this long after its last event; at a few
        # thousand objects (resources, rollouts, StatefulSets, pods) that is memory.
        settings.queueing.idle_timeout = 1.0

    elector = None
    if args.leader_election:
        timing = Timing(args.lease_duration, args.lease_renew_deadline, args.lease_retry)
        elector = LeaderElector(client, args.lease_namespace, args.lease_name, args.identity, timing)
        async with standby_health(args.liveness):
            await elector.acquire()
    if args.install_crds:
        await install_crds(client)
    resyncs = [
        asyncio.create_task(instances.resync_forever(args.namespace)),
        asyncio.create_task(objects.resync_forever(args.namespace)),
    ]
    # Returns when kopf stops (SIGTERM, SIGINT): the resync stops with it.
    controllers = asyncio.create_task(
        kopf.operator(
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            standalone=True,
            liveness_endpoint=args.liveness,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    )
    keeper = asyncio.create_task(elector.keep()) if elector else None
    try:
        await asyncio.wait([t for t in (controllers, keeper) if t], return_when=asyncio.FIRST_COMPLETED)
        if keeper is not None and keeper.done():
            try:
                keeper.result()
            except LeadershipLost as lost:
                # Another process may lead in a moment: nothing of ours may act any more, and a
                # clean shutdown of every handler takes longer than that. The container restarts
                # and waits as a standby.
                logging.getLogger("statefleet").error("%s: stopping at once", lost)
                logging.shutdown()
                os._exit(1)
        await controllers
    finally:
        for task in (*resyncs, keeper):
            if task is not None:
                task.cancel()
        if elector is not None:
            await elector.release()


def network_policy_settings(args: argparse.Namespace) -> NetworkPolicies | None:
    """The NetworkPolicies the operator makes (`--network-policies`), None when it makes none;
    settings it cannot use stop it at once, naming them."""
    if not args.network_policies:
        return None
    try:
        settings = NetworkPolicies.from_settings(
            args.operator_namespace, args.operator_pod_labels, args.network_policy_extra_from
        )
    except SettingsError as error:
        raise SystemExit(f"--network-policies: {error}") from None
    if settings.operator_namespace is None:
        logging.getLogger("statefleet").warning(
            "NetworkPolicies name no operator pods (no --operator-namespace and --operator-pod-labels): "
            "an operator outside the cluster reaches the pods from its node"
        )
    return settings


def fewer_malloc_arenas() -> None:
    """glibc gives each thread that allocates an arena of its own; the few threads here (the
    metrics server, kopf's and asyncio's helpers) then hold tens of MiB each. Two are plenty."""
    with contextlib.suppress(OSError):  # not glibc: nothing to tune
        ctypes.CDLL("libc.so.6").mallopt(-8, 2)  # M_ARENA_MAX


def main(argv: list[str] | None = None) -> int:
    program = "kubectl statefleet" if Path(sys.argv[0]).name == "kubectl-statefleet" else "statefleet"
    parser = argparse.ArgumentParser(prog=program, description="Statefleet: data services on Kubernetes")
    commands = parser.add_subparsers(dest="command", required=True)
    operator = commands.add_parser("operator", help="run every controller against the current kubeconfig")
    operator.add_argument(
        "--catalog",
        default=os.environ.get("STATEFLEET_CATALOG"),
        help="the platform team's version catalog (YAML); services it does not name offer their own",
    )
    operator.add_argument("--namespace", action="append", default=[], help="watch only these (default: all)")
    operator.add_argument(
        "--job-image",
        default=os.environ.get("STATEFLEET_JOB_IMAGE", ""),
        help="the image of backup and restore Jobs: the operator's own",
    )
    operator.add_argument(
        "--allowed-destination",
        action="append",
        default=[],
        help="a host (shell glob) that rollouts' analyses, hooks and notifications may reach; "
        f"repeat for more (default: in-cluster Services, {' '.join(IN_CLUSTER)}; * for anywhere)",
    )
    operator.add_argument(
        "--network-policies",
        action="store_true",
        default=os.environ.get("STATEFLEET_NETWORK_POLICIES") == "true",
        help="give every instance a NetworkPolicy: its pods take connections only from the operator's "
        "pods, their own, the operator's Jobs, the bound applications' pods and the extra peers",
    )
    operator.add_argument(
        "--operator-namespace",
        default=os.environ.get("POD_NAMESPACE"),
        help="the namespace of the operator's pods (let in by the NetworkPolicies)",
    )
    operator.add_argument(
        "--operator-pod-labels",
        default=os.environ.get("STATEFLEET_OPERATOR_POD_LABELS"),
        help="the labels of the operator's pods, as JSON or k=v,k=v (let in by the NetworkPolicies)",
    )
    operator.add_argument(
        "--network-policy-extra-from",
        default=os.environ.get("STATEFLEET_NETWORK_POLICY_EXTRA_FROM"),
        help="more peers every NetworkPolicy lets in: a JSON list of NetworkPolicyPeers (e.g. Prometheus)",
    )
    operator.add_argument("--install-crds", action="store_true", help="apply the CRDs first (development)")
    operator.add_argument(
        "--liveness", default=os.environ.get("STATEFLEET_LIVENESS", "http://0.0.0.0:8080/healthz")
    )
    operator.add_argument(
        "--log-format", choices=["json", "plain"], default=os.environ.get("STATEFLEET_LOG_FORMAT", "json")
    )
    operator.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("STATEFLEET_METRICS_PORT", "9090")),
        help="serve Prometheus metrics on this port (0: not at all)",
    )
    operator.add_argument(
        "--leader-election",
        action="store_true",
        default=os.environ.get("STATEFLEET_LEADER_ELECTION") == "true",
        help="act only while holding a coordination.k8s.io Lease (run several replicas; one acts)",
    )
    operator.add_argument("--lease-name", default="statefleet-operator")
    operator.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", "default"))
    operator.add_argument(
        "--identity",
        default=f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}",
        help="this process's name in the Lease (default: the pod's name and a suffix of its own, so a "
        "restarted container waits its turn like any other standby)",
    )
    operator.add_argument(
        "--lease-duration", type=float, default=8.0, help="seconds a Lease lasts unrenewed (takeover time)"
    )
    operator.add_argument(
        "--lease-renew-deadline",
        type=float,
        default=5.0,
        help="seconds the leader tries to renew before it stops (less than the duration)",
    )
    operator.add_argument("--lease-retry", type=float, default=1.0, help="seconds between looks at the Lease")
    commands.add_parser("crds", help="print the CustomResourceDefinitions")
    catalog = commands.add_parser(
        "catalog", help="print the version catalog the operator would offer (a start for your own)"
    )
    catalog.add_argument("--catalog", default=os.environ.get("STATEFLEET_CATALOG"), help="your own, over it")
    rollout_commands.add(commands)
    backup_commands.add(commands)
    for plugin in load_plugins():
        verbs = plugin.commands.add(commands) if plugin.commands is not None else None
        if plugin.rotation is not None:  # `statefleet <service> rotate-credentials NAME`
            credentials_command.add(verbs or credentials_command.group(commands, plugin), plugin)
    args = parser.parse_args(argv)

    if args.command == "crds":
        print("---\n".join(render_crds().values()), end="")
        return 0
    if args.command == "catalog":
        print(load_catalog(load_plugins(), Path(args.catalog) if args.catalog else None).to_yaml(), end="")
        return 0
    if args.command == "rollout":
        return rollout_commands.run(args)
    if hasattr(args, "handler"):  # a plugin's verb
        return int(args.handler(args, Client(field_manager="statefleet-cli")))
    kopf.configure(
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.FULL,
        log_prefix=args.log_format == "plain",  # [namespace/name] before a line about an object
        verbose=False,
    )
    for noisy in ("httpx", "httpx2", "kopf.objects"):  # a line per request or handler call
        logging.getLogger(noisy).setLevel(logging.WARNING)
    fewer_malloc_arenas()
    asyncio.run(run_operator(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
