"""Batch assembly: trajectories -> grouped, filtered, mixed, loss-masked `TrainingBatch`es.

The pure stages (`GroupAssembler`, `MixturePlanner`, `BatchBuilder`, `pack_batch`) work on any
mutable mappings; `AssemblerApp` wires them into a Faust worker whose state lives in tables.
"""

from stacx.consumers.assembly.app import TICK_KEY, AssemblerApp, FaustForwarder
from stacx.consumers.assembly.batching import BatchBuilder
from stacx.consumers.assembly.claims import BatchEncoder, decode_trajectory
from stacx.consumers.assembly.envelope import ReadyGroup, decode_group, encode_group
from stacx.consumers.assembly.errors import AssemblyConfigError, AssemblyError, InvalidTrajectoryError
from stacx.consumers.assembly.filters import FailurePolicy, SampleFilter, Verdict, invalid_reason
from stacx.consumers.assembly.grouping import GroupAssembler, PartialPolicy
from stacx.consumers.assembly.mixture import BatchUnit, MixturePlanner, PoolEntry, quotas
from stacx.consumers.assembly.packing import PackedGroup, batch_id, pack_batch
from stacx.consumers.assembly.protocols import Forwarder, LatestVersions, Output, StateTable
from stacx.consumers.assembly.stats import AssemblyStats

__all__ = [
    "TICK_KEY",
    "AssemblerApp",
    "AssemblyConfigError",
    "AssemblyError",
    "AssemblyStats",
    "BatchBuilder",
    "BatchEncoder",
    "BatchUnit",
    "FailurePolicy",
    "FaustForwarder",
    "Forwarder",
    "GroupAssembler",
    "InvalidTrajectoryError",
    "LatestVersions",
    "MixturePlanner",
    "Output",
    "PackedGroup",
    "PartialPolicy",
    "PoolEntry",
    "ReadyGroup",
    "SampleFilter",
    "StateTable",
    "Verdict",
    "batch_id",
    "decode_group",
    "decode_trajectory",
    "encode_group",
    "invalid_reason",
    "pack_batch",
    "quotas",
]
