"""A pipeline that cannot stall silently: notice when nothing moves, say which stage is stuck.

`StallWatch` is a pure clock over the run's progress counters (trajectories, batches, policy
versions, read off the topics); `diagnose` turns a stall into one paragraph: the stage that most
likely holds the others up and why, the error lines at the end of its log, and where all logs are.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Progress", "StallWatch", "diagnose", "error_tail", "likely_stuck"]

_ERROR_LINE = re.compile(r"ERROR|CRITICAL|Traceback|Error\b|Exception\b|\bfailed\b|did not answer")


@dataclass(frozen=True, slots=True)
class Progress:
    """What the run has produced so far."""

    trajectories: int
    batches: int
    versions: int
    usable: int | None = None
    """Trajectories the assembler would put in a batch (None: every one): failed or stale
    ones are dropped there and never make a batch come."""
    dropped: tuple[tuple[str, int], ...] = ()
    """(why the assembler drops them, how many), commonest first."""


@dataclass(kw_only=True, slots=True)
class StallWatch:
    """Seconds since the progress last changed."""

    timeout_s: float
    """Nothing moving for this long is a stall."""
    _last: Progress | None = None
    _since: float = 0.0

    def observe(self, progress: Progress, now: float) -> float:
        """Record `progress` at `now`; returns how long it has not changed."""
        if progress != self._last:
            self._last, self._since = progress, now
        return now - self._since

    def stalled(self, progress: Progress, now: float) -> bool:
        return self.observe(progress, now) >= self.timeout_s


def likely_stuck(
    progress: Progress, *, trajectories_per_batch: int, gateway_problem: str | None
) -> tuple[str, str]:
    """(service, why) of the stage that most likely holds the pipeline up."""
    if gateway_problem:
        return "gateway", gateway_problem
    if progress.batches > progress.versions:
        waiting = progress.batches - progress.versions
        return "trainer", f"{waiting} batch(es) on the batches topic have not become a policy version"
    usable = progress.trajectories if progress.usable is None else progress.usable
    if usable >= (progress.batches + 1) * max(1, trajectories_per_batch):
        return "assembler", (
            f"{usable} usable trajectories are on the topic, enough for batch "
            f"{progress.batches + 1} ({trajectories_per_batch} trajectories each), but no batch came"
        )
    if progress.trajectories == 0:
        return "rollout", "no trajectory was ever published (rollout -> inference server / sandbox gateway)"
    if usable < progress.trajectories:
        reasons = "; ".join(f"{n} {why}" for why, n in progress.dropped) or "failed or too stale"
        return "rollout", (
            f"{progress.trajectories - usable} of {progress.trajectories} trajectories on the topic "
            f"are dropped by the assembler ({reasons}): too few usable ones for a batch of "
            f"{trajectories_per_batch}. Fix why the episodes end so (rollout.log), or keep them: a "
            "status in assembler.filtering.ok_statuses (e.g. [COMPLETED, TRUNCATED]), a larger "
            "assembler.filtering.max_staleness"
        )
    return "rollout", (
        "no new trajectory for a batch (rollout -> inference server / sandbox gateway; the rollout "
        "also waits when it is max_staleness versions ahead of the trainer)"
    )


def error_tail(log_path: Path, lines: int = 8) -> str:
    """The last error-looking lines of a log (its last lines when none look like errors)."""
    try:
        text = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {log_path})"
    errors = [line for line in text if _ERROR_LINE.search(line)]
    chosen = (errors or text)[-lines:]
    return "\n".join(f"    {line[:300]}" for line in chosen) or "    (empty log)"


def diagnose(
    progress: Progress,
    *,
    stalled_s: float,
    trajectories_per_batch: int,
    gateway_problem: str | None,
    logs_dir: Path,
    inference_logs: Sequence[str] = ("inference",),
) -> str:
    """One paragraph for the user: what is stuck, why it looks so, its log's error lines (and,
    when the rollout waits, those of every inference server and the router), where logs are."""
    service, why = likely_stuck(
        progress, trajectories_per_batch=trajectories_per_batch, gateway_problem=gateway_problem
    )
    log_path = logs_dir / f"{service}.log"
    tails = [f"Last error lines of {log_path}:\n{error_tail(log_path)}"]
    if service == "rollout":  # it waits on the servers: what they said matters as much
        tails += [f"Last error lines of {logs_dir / f'{name}.log'}:\n{error_tail(logs_dir / f'{name}.log')}"
                  for name in inference_logs]
    logs = ", ".join(sorted(p.name for p in logs_dir.glob("*.log"))) or "none yet"
    return (
        f"the pipeline stalled: nothing moved for {stalled_s:.0f}s (trajectories {progress.trajectories}, "
        f"batches {progress.batches}, policy versions {progress.versions}). Most likely stuck: {service} "
        f"({why}). " + "\n".join(tails) + "\n"
        f"All service logs: {logs_dir} ({logs}). Raise pipeline.stall_timeout_s if a stage is just slow."
    )
