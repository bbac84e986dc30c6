"""Batch assembly: trajectories -> grouped, filtered, mixed, loss-masked `TrainingBatch`es.

The pure stages (`GroupAssembler`, `MixturePlanner`, `BatchBuilder`, `pack_batch`) work on any
mutable mappings; `AssemblerApp` wires them into a Faust worker whose state lives in tables.
"""

from consumers.assembly.app import TICK_KEY, AssemblerApp, FaustForwarder
from consumers.assembly.batching import BatchBuilder
from consumers.assembly.claims import BatchEncoder, decode_trajectory
from consumers.assembly.envelope import ReadyGroup, decode_group, encode_group
from consumers.assembly.errors import AssemblyConfigError, AssemblyError, InvalidTrajectoryError
from consumers.assembly.filters import FailurePolicy, SampleFilter, Verdict, invalid_reason
from consumers.assembly.grouping import GroupAssembler, PartialPolicy
from consumers.assembly.mixture import BatchUnit, MixturePlanner, PoolEntry, quotas
from consumers.assembly.packing import PackedGroup, batch_id, pack_batch
from consumers.assembly.protocols import Forwarder, LatestVersions, Output, StateTable
from consumers.assembly.stats import AssemblyStats

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
