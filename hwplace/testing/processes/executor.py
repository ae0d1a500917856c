"""The executor of a process cluster: simulated nodes on this machine, each worker a process of its own.

``ProcessExecutor(num_nodes=2, accelerators_per_node=4)`` simulates nodes whose environment holds
``HWPLACE_NODE_RANK`` and ``HWPLACE_FAKE_ACCELERATORS``; ``node_envs`` gives each node's environment instead;
``ProcessExecutor(inherit_env=True)`` is one node with this machine's own environment (its real accelerators). The
driver that discovers the nodes serves the hub (:mod:`~hwplace.testing.processes.hub`); the executor pickles into
the workers, where it reaches the hub by its address. It implements every method of the executor contract. Imports
the layers below and this package.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from hwplace.contracts.capabilities import (
    ChannelAddress,
    ChannelHosting,
    Leases,
    Rendezvous,
    Restarts,
    TurnAddress,
    TurnArbitration,
)
from hwplace.contracts.executor import (
    BackendRegistry,
    ClusterSpec,
    Executor,
    GroupEntry,
    GroupRequest,
    GroupRuntime,
    Handle,
)
from hwplace.contracts.records import Node, Placement
from hwplace.contracts.registry import GroupRecord, WorkerRecord
from hwplace.foundation.errors import ConfigError, HwplaceError
from hwplace.foundation.settings import FAKE_ACCELERATORS, NODE_RANK, read_node_rank
from hwplace.inventory.leases import lease_refusal
from hwplace.inventory.offline import accelerator_counts
from hwplace.planning.sharing import shared_accelerators
from hwplace.testing.processes.forked import Zygote
from hwplace.testing.processes.hub import Hub
from hwplace.testing.processes.probe import probe_nodes
from hwplace.testing.processes.runtime import EXECUTOR_NAME, ProcessGroupRuntime
from hwplace.testing.processes.service import HubClient, HubService, LocalHub, hub_at
from hwplace.testing.processes.store import ProcessObjectStore
from hwplace.testing.processes.wire import HOST, Address


def _node_envs(num_nodes: int, accelerators_per_node: int | Sequence[int], node_envs: Any, inherit_env: bool,
               env_vars: Mapping[str, str] | None) -> list[dict[str, str]]:
    if inherit_env:
        if num_nodes != 1 or node_envs is not None:
            raise ConfigError("inherit_env", "simulates one node, with this machine's own environment",
                              allowed="num_nodes=1 and no node_envs")
        return [dict(env_vars or {})]
    if node_envs is not None:
        if isinstance(node_envs, Mapping) or not all(isinstance(e, Mapping) for e in node_envs):
            raise ConfigError("node_envs", "one mapping of variables per node", value=node_envs)
        num_nodes = len(node_envs)
    counts = accelerator_counts(accelerators_per_node, num_nodes, None)
    return [{**(env_vars or {}), NODE_RANK: str(rank), FAKE_ACCELERATORS: str(count),
             **({} if node_envs is None else {str(k): str(v) for k, v in node_envs[rank].items()})}
            for rank, count in enumerate(counts)]


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a dotted name whose package is not there
        return False


def _preload(preload: Sequence[str] | None) -> tuple[str, ...] | None:
    if preload is None:
        return None
    if isinstance(preload, str) or not all(isinstance(name, str) for name in preload):
        raise ConfigError("preload", "names of modules for the workers' zygote to import", value=preload,
                          allowed="a list of module names, or None to start each worker as a new interpreter")
    missing = [name for name in preload if not _importable(name)]
    if missing:
        raise ConfigError("preload", f"no module named {', '.join(map(repr, missing))} here", value=list(preload),
                          allowed="modules this interpreter can import")
    return tuple(preload)


class ProcessExecutor(Executor, ChannelHosting, Rendezvous, Leases, TurnArbitration, Restarts):
    """Runs each worker as a process of its own (forked by the cluster's zygote, or a new interpreter), on
    simulated nodes of this machine."""

    name = EXECUTOR_NAME

    def __init__(self, num_nodes: int = 1, accelerators_per_node: int | Sequence[int] = 0, *,
                 node_envs: Sequence[Mapping[str, str]] | None = None, inherit_env: bool = False,
                 env_vars: Mapping[str, str] | None = None, preload: Sequence[str] | None = ()) -> None:
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
            raise ConfigError("num_nodes", "a whole number of nodes, at least 1", value=num_nodes)
        self._node_envs = _node_envs(num_nodes, accelerators_per_node, node_envs, inherit_env, env_vars)
        token = os.urandom(4).hex()
        self._node_ids = [f"processes-{token}-node{rank}" for rank in range(len(self._node_envs))]
        self._authkey = os.urandom(32)
        self._address: Address | None = None
        self._preload = _preload(preload)
        self._setup()

    def _setup(self) -> None:
        """What a process holds of its own: the hub it serves (the driver's), its groups, its job's name."""
        self._service: HubService | None = None
        self._groups: dict[str, ProcessGroupRuntime] = {}
        self._lock = threading.RLock()
        self._job_name: str | None = None
        self._zygote = None if self._preload is None else Zygote(self._preload)  # started by the first fork

    def __getstate__(self) -> dict[str, Any]:
        return {"_node_envs": self._node_envs, "_node_ids": self._node_ids, "_authkey": self._authkey,
                "_address": self._address, "_preload": self._preload}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    @property
    def num_nodes(self) -> int:
        return len(self._node_envs)

    def start(self) -> Address:
        """Serve the hub from this process (the driver), once; its address."""
        with self._lock:
            if self._service is None:
                if self._address is not None:
                    raise ConfigError("cluster", "this process cluster is served by its driver; a worker (or a "
                                      "process the executor was pickled into) cannot discover or launch",
                                      allowed="launch groups from the driver that made the cluster")
                self._service = HubService(Hub(), self._authkey)
                self._address = self._service.address
            return self._service.address

    def _hub(self) -> LocalHub | HubClient:
        if self._address is None:
            raise ConfigError("cluster", "this process cluster has not started",
                              allowed="discover it first: hwplace.Cluster({'executor': 'processes', ...})")
        return hub_at(self._address, self._authkey)

    def shutdown(self) -> None:
        """Stop every worker process of this executor's groups, then the hub and its servers."""
        with self._lock:
            groups, service, self._service = list(self._groups.values()), self._service, None
        for group in groups:
            group.shutdown()
        if self._zygote is not None:
            self._zygote.stop()
        if service is not None:
            service.close()
            service.hub.close()

    def discover(self, config: ClusterSpec, plugin_manager: BackendRegistry) -> list[Node]:
        self.start()
        if config.num_nodes > self.num_nodes:
            raise ConfigError("cluster.num_nodes", f"asks for {config.num_nodes} nodes but this process cluster "
                              f"simulates {self.num_nodes}", allowed=f"at most {self.num_nodes}")
        used = range(config.num_nodes)
        found = probe_nodes([self._node_envs[r] for r in used], [config.declared_configs(r) for r in used])
        return [Node(rank, self._node_ids[rank], HOST, hardware, problems)
                for rank, (hardware, problems) in zip(used, found, strict=True)]

    def free_port(self, node: Node) -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            return int(sock.getsockname()[1])

    def where(self) -> str:
        address = self.start() if self._address is None else self._address
        return f"process cluster at {address[0]}:{address[1]} ({self.num_nodes} simulated nodes on this machine)"

    def _refuse_running(self, name: str) -> None:
        if name in self._groups:
            raise ConfigError("name", f"a worker group named {name!r} is running",
                              allowed="shut it down first (group.shutdown()) or choose another name")

    def start_group(self, request: GroupRequest) -> GroupRuntime:
        service = self._service
        if service is None:
            self.start()
            service = self._service
        assert service is not None
        with self._lock:
            self._refuse_running(request.name)
            runtime = ProcessGroupRuntime(request, service, self._authkey, self._node_envs, self, self._release,
                                          self._zygote)
            self._groups[request.name] = runtime
            running = dict(self._groups)
        workers = request.workers
        entry = GroupEntry(request.name, os.urandom(8).hex(), tuple(s.placement for s in workers),
                           tuple(s.node.address for s in workers))
        service.hub.put_entry(entry)
        runtime.incarnations.publish(lambda incarnations, states: service.hub.put_entry(
            replace(entry, incarnations=incarnations, states=states)))
        components = {name: [spec.placement for spec in group.specs] for name, group in running.items()}
        service.hub.start_arbiters(workers[rank].node.node_id for (name, rank) in shared_accelerators(components)
                                   if name == request.name)
        return runtime

    def _release(self, name: str) -> None:
        with self._lock:
            self._groups.pop(name, None)
            service = self._service
        if service is not None:
            service.hub.delete_entry(name)

    def watch(self, runtime: GroupRuntime, on_death: Callable[[int, str], bool]) -> None:
        if not isinstance(runtime, ProcessGroupRuntime):
            raise HwplaceError(f"{runtime!r} was not started by a process cluster")
        runtime.watch(on_death)

    def restart(self, runtime: GroupRuntime, ranks: Sequence[int], attempt: int, cause: str) -> Handle:
        if not isinstance(runtime, ProcessGroupRuntime):
            raise HwplaceError(f"{runtime!r} was not started by a process cluster")
        return runtime.restart(ranks, attempt, cause)

    def gave_up(self, runtime: GroupRuntime, rank: int) -> None:
        if not isinstance(runtime, ProcessGroupRuntime):
            raise HwplaceError(f"{runtime!r} was not started by a process cluster")
        runtime.incarnations.gave_up(rank)

    def turn_arbiter(self, placement: Placement) -> TurnAddress | None:
        return self._hub().call("turn_arbiter", placement.node_id)  # type: ignore[no-any-return]

    def find_group(self, name: str) -> GroupEntry | None:
        return self._hub().call("find_group", name)  # type: ignore[no-any-return]

    def kv_put(self, key: str, value: bytes) -> None:
        self._hub().call("kv_put", key, value)

    def kv_wait(self, key: str, timeout: float) -> bytes:
        return self._hub().call("kv_wait", key, timeout)  # type: ignore[no-any-return]

    def _job(self, name: str | None) -> dict[str, Any]:
        """Who this process's job is, for the lease book: its pid and host, and a name."""
        if name is not None:
            self._job_name = name
        return {"id": f"{socket.gethostname()}:{os.getpid()}", "name": self._job_name, "pid": os.getpid(),
                "host": socket.gethostname()}

    def create_channel(self, name: str, maxsize: int, group: str | None, rank: int) -> ChannelAddress:
        hub = self._hub()
        node = hub.call("node_of", group, rank) if group is not None else read_node_rank()
        where = f"{HOST} (simulated node {node}, served by the driver)" if node is not None else \
            f"{HOST} (the driver)"
        return self._address_of(name, hub.call("create_channel", name, maxsize, where, self._job(None)))

    def connect_channel(self, name: str) -> ChannelAddress:
        return self._address_of(name, self._hub().call("connect_channel", name))

    def _address_of(self, name: str, info: tuple[str, int, bytes, int, str]) -> ChannelAddress:
        host, port, token, maxsize, where = info
        assert self._address is not None
        return ChannelAddress(name, host, port, token, maxsize, where,
                              ProcessObjectStore(self._address, self._authkey, name))

    def register_group(self, record: GroupRecord) -> None:
        with self._lock:
            self._refuse_running(record.group)
        conflicts = self._hub().call("register_group", self._job(record.job_name), record)
        if conflicts:
            raise lease_refusal(record.group, conflicts)

    def deregister_group(self, group: str) -> None:
        if self._address is None:
            return
        with contextlib.suppress(HwplaceError):  # the hub is gone: its leases with it
            self._hub().call("deregister_group", self._job(None)["id"], group)

    def update_workers(self, group: str, workers: Sequence[WorkerRecord]) -> None:
        if self._address is None:
            return
        with contextlib.suppress(HwplaceError):  # the hub is gone: so is the group
            self._hub().call("update_workers", self._job(None)["id"], group, tuple(workers))

    def cluster_status(self, address: str | None) -> dict[str, Any]:
        own = self.start() if self._address is None else self._address
        text = f"{own[0]}:{own[1]}"
        if address is not None and address != text:
            raise ConfigError("address", f"{address!r} is not this process cluster", allowed=text)
        found = self._hub().call("snapshot")
        nodes = [{"node_id": node_id, "address": HOST, "alive": True} for node_id in self._node_ids]
        return {"cluster": {"address": text, "nodes": nodes}, **found}
