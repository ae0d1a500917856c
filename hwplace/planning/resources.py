"""Resources of node groups: what resource ranks index, numbered node by node, group after group."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from hwplace.config.records import RESERVED_GROUPS, NodeGroup
from hwplace.contracts.hardware import Device
from hwplace.foundation.errors import ConfigError, PlacementError, PluginError
from hwplace.foundation.wording import plural
from hwplace.inventory.cluster import Cluster


class Resource(NamedTuple):
    """One resource: a device (or a whole node) of ``hardware_type`` on node ``node_rank``.

    ``device.index`` is its node-local index among the node's devices of that type. A named tuple, immutable: a
    space holds one per device, so it is made thousands of times a plan, at half the cost of a frozen dataclass.
    """

    node_rank: int
    hardware_type: str
    group: str
    device: Device

    @property
    def local_index(self) -> int:
        return self.device.index


@dataclass(frozen=True)
class ResourceSpace:
    """The resources of one or more node groups, in resource-rank order."""

    resources: tuple[Resource, ...]
    is_node_kind: bool
    description: str

    def __len__(self) -> int:
        return len(self.resources)


def _node_type(cluster: Cluster) -> str:
    try:
        return cluster.node_type()
    except PluginError as exc:
        raise PlacementError(str(exc)) from None


def group_resource_type(cluster: Cluster, group: NodeGroup) -> str:
    """What a group's resource ranks index: its declared type, else its nodes' accelerators, else nodes."""
    if group.hardware is not None:
        return group.hardware.type
    if group.ignore_hardware:
        return _node_type(cluster)
    types = cluster.accelerator_types(group.node_ranks)
    if len(types) > 1:
        reserved = group.label in RESERVED_GROUPS
        raise ConfigError("cluster.node_groups" if reserved else f"{group.path}.hardware.type",
                          f"the nodes of group {group.label!r} have accelerators of several types: "
                          f"{', '.join(types)}", allowed="define a node group whose hardware.type names the one "
                          "to use" if reserved else "name the one to use in hardware.type")
    return types[0] if types else _node_type(cluster)


def _group_devices(
    cluster: Cluster, group: NodeGroup, hardware_type: str, kind: str | None, node_rank: int
) -> tuple[Device, ...]:
    """The devices of ``hardware_type`` (of ``kind``) that ``group`` owns on one node."""
    node = cluster.nodes[node_rank]
    devices = node.devices(hardware_type)
    if kind == "node":
        if not devices:
            why = node.problems.get(hardware_type, "it reported nothing for this node")
            raise PlacementError(f"node {node_rank} has no {hardware_type!r} record, so it cannot be a node-kind "
                                 f"resource of group {group.label!r}: {why}")
        return devices[:1]
    if not group.declares_devices:
        return devices
    own = cluster.config.declared_range(group.label, node_rank)
    if len(own) and len(devices) < own.stop:
        if hardware_type in node.problems:
            why = f"detecting them failed: {node.problems[hardware_type]}"
        else:
            why = ("the cluster was not built with the config that declares them (build the Cluster, or "
                   "fake_cluster, with the same config)")
        raise PlacementError(f"group {group.label!r} declares {plural(len(own), hardware_type + ' device')} on "
                             f"node {node_rank}, but the node has {len(devices)}: {why}")
    return devices[own.start : own.stop]


def resource_space(cluster: Cluster, groups: Sequence[NodeGroup], *, nodes_only: bool = False) -> ResourceSpace:
    """Number the resources of ``groups``; with ``nodes_only`` every node of them is one resource.

    The selected groups may not share a resource: that would book it twice.
    """
    resources: list[Resource] = []
    kinds: dict[str, str] = {}
    owner: dict[tuple[int, str, int], str] = {}
    labels = [g.label for g in groups]
    twice = [label for i, label in enumerate(labels) if label in labels[:i]]
    if twice:
        raise PlacementError(f"group {twice[0]!r} is listed twice in one node_group list; it would book its "
                             "resources twice")
    for group in groups:
        hardware_type = _node_type(cluster) if nodes_only else group_resource_type(cluster, group)
        kinds[group.label] = hardware_type
        kind = cluster.kind(hardware_type)
        for rank in group.node_ranks:
            for device in _group_devices(cluster, group, hardware_type, kind, rank):
                key = (rank, hardware_type, device.index)
                if len(groups) > 1:
                    other = owner.setdefault(key, group.label)
                    if other != group.label:
                        raise PlacementError(f"groups {other!r} and {group.label!r} share {hardware_type} "
                                             f"{device.index} of node {rank}; the groups of one node_group list "
                                             "may not share a resource")
                resources.append(Resource(rank, hardware_type, group.label, device))
    node_kind = [label for label, kind in kinds.items() if cluster.kind(kind) == "node"]
    if node_kind and len(node_kind) != len(kinds):
        hardware = [f"{label} ({kind})" for label, kind in kinds.items() if label not in node_kind]
        raise PlacementError(f"node groups of node kind ({', '.join(node_kind)}) and of hardware kind "
                             f"({', '.join(hardware)}) cannot be mixed in one node_group list")
    description = _describe(cluster, groups, kinds, len(resources), nodes_only)
    return ResourceSpace(tuple(resources), bool(node_kind), description)


def _describe(
    cluster: Cluster, groups: Sequence[NodeGroup], kinds: dict[str, str], count: int, nodes_only: bool
) -> str:
    labels = " + ".join(repr(g.label) for g in groups)
    types = sorted(set(kinds.values()))
    node_kind = all(cluster.kind(t) == "node" for t in types)
    what = plural(count, "node") if node_kind else plural(count, f"{'/'.join(types)} resource")
    text = f"group {labels} has {what}" if len(groups) == 1 else f"groups {labels} have {what}"
    unmarked = [g for g in groups if g.hardware is None and not g.ignore_hardware]
    if node_kind and unmarked and not nodes_only:
        text += (f" (no accelerator was detected on {'its' if len(groups) == 1 else 'their'} nodes, so "
                 "the resources are the nodes themselves)")
    return text
