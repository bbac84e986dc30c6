"""Values several services of a run must agree on (a topic one writes and another reads, the
policy's name on the weights topic, the Kafka cluster).

A user may set a wire in any of its places; that value then holds for the whole run (the places
left empty get it). Two different values for one wire are an error naming both places: nothing the
user set is overwritten, and nothing is silently left inconsistent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["WIRES", "Wire", "get_path", "wire_conflicts", "wire_value"]


@dataclass(frozen=True, slots=True)
class Wire:
    """One shared value and every place (section, key, key, ...) it is written."""

    name: str
    places: tuple[tuple[str, ...], ...]


WIRES: dict[str, Wire] = {
    wire.name: wire
    for wire in (
        Wire(
            "bootstrap_servers",
            (
                ("bootstrap_servers",),
                ("rollout", "kafka", "bootstrap_servers"),
                ("assembler", "bootstrap_servers"),
                ("trainer", "source", "bootstrap_servers"),
                ("trainer", "export", "bootstrap_servers"),
            ),
        ),
        Wire(
            "trajectories_topic",
            (
                ("rollout", "kafka", "trajectories_topic"),
                ("assembler", "trajectories_topic"),
            ),
        ),
        Wire("batches_topic", (("assembler", "batches_topic"), ("trainer", "source", "topic"))),
        Wire(
            "weights_topic",
            (
                ("rollout", "kafka", "weights_topic"),
                ("assembler", "weights_topic"),
                ("trainer", "export", "topic"),
            ),
        ),
        Wire("model_name", (("rollout", "manager", "model_name"), ("trainer", "export", "model_name"))),
        Wire(
            "group_size", (("rollout", "data", "samples_per_task"), ("assembler", "grouping", "group_size"))
        ),
    )
}


def get_path(tree: Any, path: tuple[str, ...]) -> Any:
    """`tree[a][b]...`, None where any level is missing or not a mapping."""
    for key in path:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(key)
    return tree


def _user_values(sections: dict[str, Any], wire: Wire) -> list[tuple[str, Any]]:
    found = []
    for place in wire.places:
        value = get_path(sections, place)
        if value is not None:
            found.append((".".join(place), value))
    return found


def wire_value(sections: dict[str, Any], name: str) -> Any:
    """The value the user set for wire `name` (in any place), or None."""
    found = _user_values(sections, WIRES[name])
    return found[0][1] if found else None


def wire_conflicts(sections: dict[str, Any], source: str) -> list[str]:
    """One line per wire set to different values in different places."""
    lines = []
    for wire in WIRES.values():
        found = _user_values(sections, wire)
        if len({str(v) for _, v in found}) > 1:
            shown = ", ".join(f"{place}={value!r}" for place, value in found)
            lines.append(
                f"{source}: {shown}: these services must agree on one {wire.name}; set one value "
                "(the places left empty get it)"
            )
    return lines
