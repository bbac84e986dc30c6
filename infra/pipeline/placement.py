"""Device placement: which GPUs the trainer ranks and each inference server get (`resources:`).

One section says it for the whole run:

    resources:
      trainer: [0, 1]          # one FSDP2 rank per GPU
      inference: [2, 3]        # inference.servers x inference.tp_size GPUs, in server order
      colocate: false          # true: trainer and servers may share GPUs (set inference.mem_fraction)

`place` turns it into a `Placement` (pure: checked on any machine, GPUs or not); each service
then sees only its own GPUs through `CUDA_VISIBLE_DEVICES`. Without the section nothing is
placed: every service runs where its own section says (the CPU default).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Placement", "ResourcesConfig", "place", "visible_devices"]


class ResourcesConfig(BaseModel):
    """The `resources:` section: GPUs of the trainer and of the inference servers."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    trainer: list[int] = Field(default_factory=list)
    """CUDA device indices of the trainer: one FSDP2 rank per GPU (empty: the trainer section
    decides, CPU by default)."""
    inference: list[int] = Field(default_factory=list)
    """CUDA device indices of the inference servers: `tp_size` consecutive ones per server, in
    server order (empty: the inference section decides)."""
    colocate: bool = False
    """Trainer and servers share GPUs (the lists may overlap; the servers then need
    `inference.mem_fraction` to leave the trainer room)."""


@dataclass(kw_only=True, slots=True)
class Placement:
    """GPUs per service; empty lists: not placed (the service's own section decides)."""

    trainer: list[int] = field(default_factory=list)
    servers: list[list[int]] = field(default_factory=list)
    """One list per inference server (empty lists when the servers are not placed)."""

    @property
    def placed(self) -> bool:
        return bool(self.trainer or any(self.servers))

    def all_gpus(self) -> list[int]:
        return sorted({*self.trainer, *(g for gpus in self.servers for g in gpus)})


def place(
    resources: ResourcesConfig | None, *, servers: int, tp_size: int, mem_fraction: float | None
) -> tuple[Placement, list[str]]:
    """The placement of `servers` servers of `tp_size` GPUs each, and one line per problem."""
    if resources is None:
        return Placement(servers=[[] for _ in range(servers)]), []
    problems = [
        f"resources.{name}: {gpus} lists a GPU twice"
        for name, gpus in (("trainer", resources.trainer), ("inference", resources.inference))
        if len(set(gpus)) != len(gpus)
    ]
    negative = sorted(g for g in {*resources.trainer, *resources.inference} if g < 0)
    problems += [f"resources: GPU index {g} is negative" for g in negative]
    wanted = servers * tp_size
    gpus = resources.inference
    if gpus and len(gpus) != wanted:
        problems.append(
            f"resources.inference: {len(gpus)} GPU(s) {gpus}, but inference.servers x "
            f"inference.tp_size = {servers} x {tp_size} = {wanted}; list {wanted} GPUs or change them"
        )
    shared = sorted(set(resources.trainer) & set(gpus))
    if shared and not resources.colocate:
        problems.append(
            f"resources: GPU(s) {shared} are in both trainer and inference; set resources.colocate: "
            "true to share them, or give each its own GPUs"
        )
    if shared and resources.colocate and mem_fraction is None:
        problems.append(
            "resources.colocate: the servers share GPUs with the trainer; set inference.mem_fraction "
            "(e.g. 0.5) so that SGLang leaves the trainer room"
        )
    if problems:
        return Placement(), problems
    per_server = [gpus[i * tp_size:(i + 1) * tp_size] if gpus else [] for i in range(servers)]
    return Placement(trainer=list(resources.trainer), servers=per_server), []


def visible_devices(gpus: list[int]) -> dict[str, str]:
    """The environment that shows a service exactly `gpus` (none: nothing set)."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)} if gpus else {}
