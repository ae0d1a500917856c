"""The Ray executor: connects to Ray (or starts it), discovers the nodes, and starts worker groups.

Ray is imported when a method is called, never when hwplace loads this plugin.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import hwplace
from hwplace import ConfigError, Node, Placement, PlacementError
from hwplace.executor import (
    BackendRegistry,
    ChannelAddress,
    ChannelHosting,
    ClusterSpec,
    GroupEntry,
    GroupRecord,
    GroupRequest,
    GroupRuntime,
    Handle,
    Leases,
    LocalClusters,
    Rendezvous,
    Restarts,
    TurnAddress,
    TurnArbitration,
    WorkerRecord,
    detect_timeout,
    first_line,
    lease_refusal,
)
from hwplace_plugins.ray.connect import connect, connected, import_ray
from hwplace_plugins.ray.local_cluster import local_ray_cluster
from hwplace_plugins.ray.ranks import RANK_VARIABLE, FoundNode, assign_ranks, nodes_table

ACTOR_PREFIX = "hwplace.channel."

if TYPE_CHECKING:
    from types import ModuleType

REGISTRY_TIMEOUT = 60.0  # seconds for the registry to answer (its first call may start its actor)
STARTUP_ALLOWANCE = 60.0  # seconds a node may take to start the process that runs its detection
HEAD_RESOURCE = "node:__internal_head__"


def _summary(hardware: dict[str, Any]) -> str:
    """``"8 fake-accelerator, 1 fake-robot"``: what a node has besides itself, for the nodes table."""
    return ", ".join(f"{len(devices)} {name}" for name, devices in sorted(hardware.items()) if name != "node")


class RayExecutor(hwplace.Executor, ChannelHosting, Rendezvous, Leases, TurnArbitration, LocalClusters, Restarts):
    """Runs workers as Ray actors, each pinned to its node; offers every capability."""

    name = "ray"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, GroupRuntime] = {}
        self._remote: dict[str, Any] = {}
        self._channels: dict[str, Any] = {}  # Ray stops a named actor once no handle is left: these keep them
        self._registry: tuple[str, Any] | None = None  # (the cluster's address, its registry actor)
        self._job_name: str | None = None
        self._session = ""  # the Ray session (job id) the handles above belong to

    def remote(self, name: str) -> Any:
        """A Ray remote function or actor class of this plugin, made once per process."""
        if name not in self._remote:
            ray = import_ray()
            from hwplace_plugins.ray import (  # noqa: PLC0415 (they import Ray: loaded on first use)
                channel,
                host,
                probe,
                turns,
            )

            made = {
                "inspect_node": lambda: ray.remote(num_cpus=0, max_retries=0)(probe.inspect_node),
                "free_port": lambda: ray.remote(num_cpus=0, max_retries=0)(probe.free_port),
                "host": lambda: ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0,
                                           concurrency_groups=host.concurrency_groups())(host.WorkerHost),
                "channel": lambda: ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(channel.ChannelHost),
                "turns": lambda: ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(turns.TurnHost),
            }
            self._remote[name] = made[name]()
        return self._remote[name]

    def discover(self, config: ClusterSpec, plugin_manager: BackendRegistry) -> list[Node]:
        ray = connect(config.address)
        seen = [FoundNode(n["NodeID"], n["NodeManagerAddress"], HEAD_RESOURCE in n.get("Resources", {}),
                          label_rank=(n.get("Labels") or {}).get(RANK_VARIABLE))
                for n in ray.nodes() if n.get("Alive")]
        answers = dict(zip((f.node_id for f in seen), self._probe(ray, seen, [{}] * len(seen)), strict=True))
        ranked = assign_ranks([replace(f, env_rank=answers[f.node_id][0], hostname=answers[f.node_id][1],
                                       hardware_summary=_summary(answers[f.node_id][2])) for f in seen])
        if config.num_nodes > len(ranked):
            raise ConfigError("cluster.num_nodes", f"asks for {config.num_nodes} nodes but Ray has "
                              f"{len(ranked)} alive", allowed=f"start more nodes, or lower num_nodes\n"
                              f"{nodes_table(ranked)}")
        used = ranked[: config.num_nodes]  # in rank order: a node's position is its rank
        # The devices a config declares are detected on their own node, once its rank is known.
        declared = [config.declared_configs(rank) for rank in range(len(used))]
        with_devices = [rank for rank, configs in enumerate(declared) if configs]
        if with_devices:
            probed = self._probe(ray, [used[r] for r in with_devices], [declared[r] for r in with_devices])
            answers.update((used[r].node_id, answer) for r, answer in zip(with_devices, probed, strict=True))
        return [Node(rank, f.node_id, f.address, answers[f.node_id][2], answers[f.node_id][3])
                for rank, f in enumerate(used)]

    def _probe(self, ray: ModuleType, nodes: Sequence[FoundNode], declared: Sequence[Any]) -> list[Any]:
        """Run ``probe.inspect_node`` on each node (pinned there, all at once) with its declared configs.

        A node that does not answer in time, or whose probe fails, is a ``ConfigError`` with the table.
        """
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415 (optional: Ray)

        inspect = self.remote("inspect_node")
        refs = [inspect.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False))
                .remote(configs) for n, configs in zip(nodes, declared, strict=True)]
        timeout = detect_timeout() + STARTUP_ALLOWANCE
        _ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if pending:
            silent = [node for ref, node in zip(refs, nodes, strict=True) if ref in set(pending)]
            for ref in pending:
                ray.cancel(ref, force=True)
            raise ConfigError("cluster", f"nodes did not answer hardware detection within "
                              f"{timeout:g} s: " + ", ".join(f"{n.node_id[:12]} ({n.address})" for n in silent),
                              allowed=f"check those nodes' raylets; HWPLACE_DETECT_TIMEOUT bounds each "
                              f"backend\n{nodes_table(nodes)}")
        results = []
        for ref, node in zip(refs, nodes, strict=True):
            try:
                results.append(ray.get(ref))
            except ray.exceptions.RayError as exc:
                missing = _missing_hwplace(exc)
                if missing:
                    raise ConfigError("cluster", f"the workers of Ray node {node.node_id[:12]} ({node.address}) "
                                      f"cannot import hwplace ({missing}): this cluster's nodes run a Python "
                                      "without it", allowed="install hwplace (the driver's version, with its "
                                      "plugins) in the Python environment each node's 'ray start' runs in, and "
                                      "restart those nodes; or pass it to the workers with Ray's runtime_env "
                                      "(py_modules or pip) when you call ray.init yourself") from None
                raise ConfigError("cluster", f"hardware detection failed on node {node.node_id[:12]} "
                                  f"({node.address}): {exc}") from None
        return results

    def free_port(self, node: Node) -> int:
        ray = import_ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415 (optional: Ray)

        if not ray.is_initialized():
            raise PlacementError("the Ray session this cluster was discovered in has ended (ray.shutdown()); "
                                 "make a new hwplace.Cluster")
        task = self.remote("free_port").options(scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id,
                                                                                                 soft=False))
        try:
            return int(ray.get(task.remote(), timeout=STARTUP_ALLOWANCE))
        except (ray.exceptions.RayError, TimeoutError) as exc:
            lines = [line for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
            raise PlacementError(f"node {node.rank} ({node.address}, Ray node {node.node_id[:12]}) cannot run a "
                                 f"task: {lines[0].strip()}; the node may be gone: make a new hwplace.Cluster to "
                                 "see the nodes there are now") from None

    def where(self) -> str:
        return f"Ray cluster at {import_ray().get_runtime_context().gcs_address}"

    def registry(self, create: bool = True) -> Any:
        """The cluster's registry actor (made by the first job that needs it, found by the others), or ``None``
        when ``create`` is off and there is none yet."""
        ray = import_ray()
        from hwplace_plugins.ray import registry  # noqa: PLC0415 (imports Ray's state: loaded on first use)

        with self._lock:
            self._forget_ended_sessions()
        cluster = ray.get_runtime_context().gcs_address
        if self._registry is None or self._registry[0] != cluster:
            if not create:
                try:
                    return ray.get_actor(registry.NAME, namespace=registry.NAMESPACE)
                except ValueError:
                    return None
            actor = ray.remote(num_cpus=0, max_restarts=0)(registry.Registry).options(
                name=registry.NAME, namespace=registry.NAMESPACE, lifetime="detached", get_if_exists=True,
                resources={HEAD_RESOURCE: 0.001}).remote()
            self._registry = (cluster, actor)
        return self._registry[1]

    def _job(self, name: str | None) -> dict[str, Any]:
        """Who this process's job is, for the registry: Ray's job id, a name, the driver's pid and host."""
        ray = import_ray()
        if name is not None:
            self._job_name = name
        return {"id": ray.get_runtime_context().get_job_id(), "name": self._job_name, "pid": os.getpid(),
                "host": socket.gethostname()}

    def _ask(self, call: Any) -> Any:
        ray = import_ray()
        try:
            return ray.get(call, timeout=REGISTRY_TIMEOUT)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            raise PlacementError(f"hwplace's registry on this Ray cluster did not answer ({exc}); it keeps "
                                 "the device leases, so nothing was launched") from None

    def _forget_ended_sessions(self) -> None:
        """Forget what belonged to a Ray session that has ended: its groups' names, the handles of its actors.
        Called (with the lock held) before any of those is kept, so what is kept belongs to ``self._session``."""
        from hwplace_plugins.ray.runtime import session  # noqa: PLC0415 (imports Ray: loaded on first use)

        now = session()
        if now == self._session:
            return
        self._session = now
        for name in [n for n, g in self._groups.items() if getattr(g, "session", now) != now]:
            del self._groups[name]
        self._channels.clear()
        self._registry = None

    def _refuse_running(self, name: str) -> None:
        """Under the lock: a ``ConfigError`` when a group of this session named ``name`` is running."""
        self._forget_ended_sessions()
        if name in self._groups:
            raise ConfigError("name", f"a worker group named {name!r} is running",
                              allowed="shut it down first (group.shutdown()) or choose another name")

    def register_group(self, record: GroupRecord) -> None:
        with self._lock:
            self._refuse_running(record.group)
        conflicts = self._ask(self.registry().register_group.remote(self._job(record.job_name), record))
        if conflicts:
            raise lease_refusal(record.group, conflicts)

    def deregister_group(self, group: str) -> None:
        ray = import_ray()
        if not ray.is_initialized():
            return  # the session ended: its leases ended with its job
        with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
            ray.get(self.registry().deregister_group.remote(self._job(None)["id"], group), timeout=REGISTRY_TIMEOUT)

    def update_workers(self, group: str, workers: Sequence[WorkerRecord]) -> None:
        ray = import_ray()
        if not ray.is_initialized():
            return
        with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
            ray.get(self.registry().update_workers.remote(self._job(None)["id"], group, tuple(workers)),
                    timeout=REGISTRY_TIMEOUT)

    def cluster_status(self, address: str | None) -> dict[str, Any]:
        ray = connect(address)
        actor = self.registry(create=False)
        found: dict[str, Any] = {"jobs": [], "groups": [], "leases": [], "channels": []}
        if actor is not None:
            try:
                found = ray.get(actor.snapshot.remote(), timeout=REGISTRY_TIMEOUT)
            except (ray.exceptions.RayError, TimeoutError) as exc:
                raise ConfigError("cluster", f"hwplace's registry on this Ray cluster did not answer ({exc})",
                                  allowed="check the head node's raylet") from None
        nodes = [{"node_id": n["NodeID"], "address": n["NodeManagerAddress"], "alive": bool(n.get("Alive"))}
                 for n in ray.nodes()]
        return {"cluster": {"address": ray.get_runtime_context().gcs_address, "nodes": nodes}, **found}

    def start_group(self, request: GroupRequest) -> GroupRuntime:
        from hwplace_plugins.ray.runtime import RayGroupRuntime  # noqa: PLC0415 (imports Ray: loaded on first use)

        with self._lock:
            self._refuse_running(request.name)
            runtime = RayGroupRuntime(request, self.remote("host"), release=self._release)
            self._groups[request.name] = runtime
        directory = json.dumps([spec.node.node_id for spec in request.workers]).encode()
        internal_kv()._internal_kv_put(f"group:{request.name}", directory, overwrite=True, namespace=kv_namespace())
        workers = request.workers
        entry = GroupEntry(request.name, os.urandom(8).hex(), tuple(s.placement for s in workers),
                           tuple(s.node.address for s in workers))
        rendezvous().put_entry(entry)
        runtime.incarnations.publish(lambda incarnations, states: rendezvous().put_entry(
            replace(entry, incarnations=incarnations, states=states)))
        from hwplace_plugins.ray.turns import start_arbiters  # noqa: PLC0415 (imports Ray: loaded on first use)

        with self._lock:
            running = dict(self._groups)
        start_arbiters(request, running, self.remote("turns"))
        return runtime

    def watch(self, runtime: GroupRuntime, on_death: Callable[[int, str], bool]) -> None:
        runtime.watch(on_death)  # type: ignore[attr-defined]  # a RayGroupRuntime: this executor started it

    def restart(self, runtime: GroupRuntime, ranks: Sequence[int], attempt: int, cause: str) -> Handle:
        return runtime.restart(ranks, attempt, cause)  # type: ignore[attr-defined,no-any-return]

    def gave_up(self, runtime: GroupRuntime, rank: int) -> None:
        runtime.incarnations.gave_up(rank)  # type: ignore[attr-defined]

    def turn_arbiter(self, placement: Placement) -> TurnAddress | None:
        from hwplace_plugins.ray.turns import find_arbiter  # noqa: PLC0415 (imports Ray: loaded on first use)

        return find_arbiter(placement.node_id)

    def _release(self, name: str, ended: bool = False) -> None:
        """Free a group's name; ``ended``: its Ray session ended, and what it recorded in Ray with it."""
        with self._lock:
            self._groups.pop(name, None)
        if ended:
            return
        internal_kv()._internal_kv_del(f"group:{name}", namespace=kv_namespace())
        rendezvous().delete_entry(name)

    def find_group(self, name: str) -> GroupEntry | None:
        return rendezvous().find_entry(name)  # type: ignore[no-any-return]

    def local_cluster(self, node_envs: Sequence[Mapping[str, str]], *,
                      cpus_per_node: int) -> contextlib.AbstractContextManager[str]:
        return local_ray_cluster(node_envs, cpus_per_node=cpus_per_node)

    def kv_put(self, key: str, value: bytes) -> None:
        rendezvous().kv_put(key, value)

    def kv_wait(self, key: str, timeout: float) -> bytes:
        return rendezvous().kv_wait(key, timeout)  # type: ignore[no-any-return]

    def create_channel(self, name: str, maxsize: int, group: str | None, rank: int) -> ChannelAddress:
        ray = connected("Channel.create")
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415 (optional: Ray)

        with self._lock:
            self._forget_ended_sessions()  # before a handle of this session is kept
        node_id = ray.get_runtime_context().get_node_id() if group is None else self._node_of(group, rank)
        options = {"name": ACTOR_PREFIX + name,
                   "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
        try:
            actor = self.remote("channel").options(**options).remote(maxsize, name)
        except ValueError:
            if not self._free_dead_name(name):
                raise ConfigError("channel name", f"a channel named {name!r} exists", allowed="connect to it "
                                  "with Channel.connect(name), or choose another name") from None
            actor = self.remote("channel").options(**options).remote(maxsize, name)
        self._channels[name] = actor
        address = self._address(name, actor)
        with contextlib.suppress(ray.exceptions.RayError, TimeoutError):  # what hwplace status shows, no more
            ray.get(self.registry().register_channel.remote(self._job(None), name, address.where),
                    timeout=REGISTRY_TIMEOUT)
        return address

    def _free_dead_name(self, name: str) -> bool:
        """Free the name of a channel whose host died (its node's raylet with it, say): Ray keeps a dead actor's
        name while handles to it live. Whether the name is free now."""
        ray = import_ray()
        try:
            existing = ray.get_actor(ACTOR_PREFIX + name)
            ray.get(existing.start.remote(), timeout=REGISTRY_TIMEOUT)
            return False  # alive
        except ValueError:
            return True  # gone meanwhile
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnschedulableError):
            pass
        except (ray.exceptions.RayError, TimeoutError):
            return False
        self._channels.pop(name, None)
        with contextlib.suppress(ray.exceptions.RayError, ValueError):
            ray.kill(existing, no_restart=True)
        del existing
        with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
            self.registry().deregister_channel.remote(name)
        return True

    def connect_channel(self, name: str) -> ChannelAddress:
        ray = connected("Channel.connect")
        try:
            actor = ray.get_actor(ACTOR_PREFIX + name)
        except ValueError:
            there = sorted(n[len(ACTOR_PREFIX):] for n in ray.util.list_named_actors() if n.startswith(ACTOR_PREFIX))
            raise ConfigError("channel name", f"there is no channel named {name!r}",
                              allowed="channels here: " + (", ".join(there) if there else "none") +
                              "; create it first with Channel.create(name)") from None
        return self._address(name, actor)

    def _address(self, name: str, actor: Any) -> ChannelAddress:
        ray = import_ray()
        from hwplace_plugins.ray.channel import RayObjectStore  # noqa: PLC0415 (imports Ray: loaded on first use)

        try:
            host, port, token, maxsize, node_id = ray.get(actor.start.remote())
        except ray.exceptions.RayActorError as exc:
            raise hwplace.ChannelLost(f"channel {name!r}: its host process is gone ({first_line(exc)})") from None
        except ray.exceptions.ActorUnschedulableError as exc:
            raise hwplace.ChannelLost(f"channel {name!r}: its host cannot start, its node is gone "
                                      f"({first_line(exc)})") from None
        where = f"{host} (Ray node {node_id[:12]})"
        return ChannelAddress(name, host, port, token, maxsize, where, RayObjectStore(actor, f"channel {name!r}"),
                              node_id)

    def _node_of(self, group: str, rank: int) -> str:
        """The Ray node id of worker ``rank`` of the running group ``group``."""
        found = internal_kv()._internal_kv_get(f"group:{group}", namespace=kv_namespace())
        if found is None:
            raise ConfigError("group_affinity", f"there is no running worker group named {group!r}",
                              allowed="the name a group was launched under")
        nodes = json.loads(found)
        if rank >= len(nodes):
            raise ConfigError("group_rank_affinity", f"group {group!r} has ranks 0-{len(nodes) - 1}", value=rank)
        return str(nodes[rank])


def _missing_hwplace(error: BaseException) -> str | None:
    """The import failure behind a probe's error when a node's workers lack hwplace (or its Ray plugin), or
    ``None`` for any other failure."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ImportError) and (seen.name or "").partition(".")[0] in ("hwplace", "hwplace_plugins"):
            return f"{type(seen).__name__}: {seen}"
        seen = getattr(seen, "cause", None) or seen.__cause__
    found = re.search(r"(ModuleNotFoundError|ImportError): (No module named '?hwplace[\w.]*'?)", str(error))
    return f"{found.group(1)}: {found.group(2)}" if found else None


def internal_kv() -> ModuleType:
    """Ray's key-value store in its control service: the directory of running groups, readable from workers."""
    from ray.experimental import internal_kv  # noqa: PLC0415 (optional: Ray)

    return internal_kv


def rendezvous() -> ModuleType:
    """:mod:`hwplace_plugins.ray.rendezvous`, which imports Ray: loaded on first use."""
    from hwplace_plugins.ray import rendezvous as module  # noqa: PLC0415 (imports Ray: loaded on first use)

    return module


def kv_namespace() -> str:
    """The directory's namespace: one per Ray namespace, so two jobs' groups do not meet."""
    return f"hwplace:{import_ray().get_runtime_context().namespace}"

