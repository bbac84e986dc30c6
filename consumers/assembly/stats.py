"""Counters of what the assembler did with each event (per process, not replicated)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from stacx.schemas.records import TrainingBatch

__all__ = ["DROPPED_LINE", "AssemblyStats", "log_dropped"]

log = logging.getLogger("stacx.consumers.assembly")

DROPPED_LINE = "group %s of %s dropped: %s"
"""The line of a group dropped whole (the chaos audit reads it back from the assembler's log)."""


def log_dropped(group_id: str, model_name: str, reason: str) -> None:
    """One line per group the assembler drops whole (the staleness filter, the partial-group
    policy), next to the `groups_dropped` count: a dropped group can be told from a lost one."""
    log.info(DROPPED_LINE, group_id, model_name, reason)


@dataclass(kw_only=True, slots=True)
class AssemblyStats:
    trajectories: int = 0
    """Trajectory events consumed (decodable or not)."""
    undecodable: int = 0
    """Events sent to the dead-letter topic because they do not decode or break their type's rules."""
    invalid: int = 0
    """Sound trajectories sent to the dead-letter topic because their token ids lie outside
    `filtering.vocab_size` (tokenized for another model)."""
    duplicates: int = 0
    """Samples dropped because their trajectory id was already seen."""
    late: int = 0
    """Samples dropped because their group had already been closed."""
    stale: int = 0
    """Samples dropped because their policy-version lag exceeded `max_staleness`."""
    failed_dropped: int = 0
    """Failed samples dropped under the `drop` failure policy."""
    failed_flagged: int = 0
    """Failed samples kept under the `flag` or `mask` failure policy."""
    kept: int = 0
    """Samples accepted into a group."""
    groups_complete: int = 0
    """Groups closed with all `n` samples arrived."""
    groups_timed_out: int = 0
    """Groups closed by the timeout."""
    groups_dropped: int = 0
    """Closed groups not forwarded (partial policy `drop`, too few samples, or stale)."""
    groups_padded: int = 0
    """Partial groups forwarded with padding."""
    groups_rejected: int = 0
    """Pooled groups that could not be packed (e.g. a claim-check blob vanished): dead-lettered."""
    groups_redelivered: int = 0
    """Groups seen again by the packing stage (at-least-once redelivery) and ignored."""
    batches: int = 0
    """Training batches emitted (encoded and handed to the producer)."""
    sequences: int = 0
    """Sequences packed into emitted batches (padding included)."""
    first_event_ms: int = 0
    """Wall-clock time of the first trajectory event this process saw."""

    def batch_sent(self, batch: TrainingBatch) -> None:
        """Count a batch once it is encoded and handed on (not when it is packed)."""
        self.batches += 1
        self.sequences += batch.num_sequences

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
