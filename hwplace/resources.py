"""Resources of node groups: what resource ranks index, numbered node by node, group after group."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hwplace.cluster import Cluster
from hwplace.config import RESERVED_GROUPS, NodeGroup
from hwplace.errors import ConfigError, PlacementError
from hwplace.hardware import Device

NODE = "node"
_NODE_DEVICE = Device(0, "node")


@dataclass(frozen=True)
class Resource:
    """One resource: a device (or a whole node) at ``local_index`` on node ``node_rank``."""

    node_rank: int
    local_index: int
    hardware_type: str
    group: str
    device: Device


@dataclass(frozen=True)
class ResourceSpace:
    """The resources of one or more node groups, in resource-rank order."""

    resources: tuple[Resource, ...]
    is_node_kind: bool
    description: str

    def __len__(self) -> int:
        return len(self.resources)


def group_resource_type(cluster: Cluster, group: NodeGroup) -> str:
    """What a group's resource ranks index: its declared type, else its nodes' accelerators, else nodes."""
    if group.hardware is not None:
        return group.hardware.type
    if group.ignore_hardware:
        return NODE
    types = cluster.accelerator_types(group.node_ranks)
    if len(types) > 1:
        reserved = group.label in RESERVED_GROUPS
        raise ConfigError("cluster.node_groups" if reserved else f"{group.path}.hardware.type",
                          f"the nodes of group {group.label!r} have accelerators of several types: "
                          f"{', '.join(types)}", allowed="define a node group whose hardware.type names the one "
                          "to use" if reserved else "name the one to use in hardware.type")
    return types[0] if types else NODE


def resource_space(cluster: Cluster, groups: Sequence[NodeGroup], *, nodes_only: bool = False) -> ResourceSpace:
    """Number the resources of ``groups``; with ``nodes_only`` every node of them is one resource."""
    resources: list[Resource] = []
    kinds: dict[str, str] = {}
    for group in groups:
        hardware_type = NODE if nodes_only else group_resource_type(cluster, group)
        kinds[group.label] = hardware_type
        for rank in group.node_ranks:
            node = cluster.nodes[rank]
            if hardware_type == NODE:
                info = node.devices(NODE)
                resources.append(Resource(rank, 0, NODE, group.label, info[0] if info else _NODE_DEVICE))
            else:
                resources.extend(Resource(rank, d.index, hardware_type, group.label, d)
                                 for d in node.devices(hardware_type))
    node_kind = [label for label, kind in kinds.items() if kind == NODE]
    if node_kind and len(node_kind) != len(kinds):
        hardware = [f"{label} ({kind})" for label, kind in kinds.items() if kind != NODE]
        raise PlacementError(f"node groups of node kind ({', '.join(node_kind)}) and of hardware kind "
                             f"({', '.join(hardware)}) cannot be mixed in one node_group list")
    return ResourceSpace(tuple(resources), bool(node_kind), _describe(cluster, groups, kinds, len(resources)))


def _describe(cluster: Cluster, groups: Sequence[NodeGroup], kinds: dict[str, str], count: int) -> str:
    labels = " + ".join(repr(g.label) for g in groups)
    types = sorted(set(kinds.values()))
    what = "nodes" if types == [NODE] else f"{'/'.join(types)} resources"
    text = f"{count} {what} in group{'s' if len(groups) > 1 else ''} {labels}"
    if count == 0 and any(g.hardware is not None and cluster.kind(g.hardware.type) == "device" for g in groups):
        text += " (declared devices are detected by the Cluster: build it with the same config)"
    return text
