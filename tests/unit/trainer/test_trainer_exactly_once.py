"""Exactly-once training: a version is announced only after the checkpoint that covers it, a crash
between the two is repaired with the same contents, and interrupted runs run no collective."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from stacx.schemas.records import WeightVersion
from stacx.trainer import InMemoryBatchSource, InMemoryWeightPublisher, StacxTrainer
from stacx.trainer.backends.base import Backend
from stacx.trainer.export import content_hash
from stacx.trainer.testing import synthetic_batches, tiny_trainer_config


class _Crash(RuntimeError):
    """Stands for kill -9 at the announcement of one version."""


class _AuditingPublisher(InMemoryWeightPublisher):
    """Records, at each announcement, the step of the newest checkpoint on disk; can crash."""

    def __init__(self, root: Path, crash_at: int | None = None) -> None:
        super().__init__()
        self.root = root
        self.crash_at = crash_at
        self.checkpoint_steps: list[int] = []

    def publish(self, version: WeightVersion) -> None:
        if version.version == self.crash_at:
            raise _Crash(f"killed while announcing v{version.version}")
        marker = self.root / "latest"
        state = json.loads((self.root / marker.read_text() / "trainer_state.json").read_text()) \
            if marker.is_file() else {"step": 0}
        self.checkpoint_steps.append(int(state["step"]))
        super().publish(version)


def _trainer(tmp: Path, publisher: InMemoryWeightPublisher, every: int = 5) -> StacxTrainer:
    config = tiny_trainer_config("grpo", tmp)
    config.checkpoint.every_steps = every  # exports (every step) force their own checkpoint
    return StacxTrainer(config, source=InMemoryBatchSource(synthetic_batches(4)),
                        publisher=publisher)


def test_each_version_is_announced_after_the_checkpoint_that_covers_it(tmp_path: Path) -> None:
    publisher = _AuditingPublisher(tmp_path / "ckpt")
    _trainer(tmp_path, publisher).run(4)
    assert [v.version for v in publisher.published] == [1, 2, 3, 4]
    assert publisher.checkpoint_steps == [1, 2, 3, 4]
    state = json.loads((tmp_path / "ckpt" / "step_00000004" / "trainer_state.json").read_text())
    assert state["positions"] == {"memory/0": 4} and state["published_version"] == 3


def test_a_crash_before_the_announcement_is_repaired_with_the_same_contents(
        tmp_path: Path) -> None:
    reference = InMemoryWeightPublisher()
    _trainer(tmp_path / "reference", reference).run(4)
    expected = {v.version: v.content_hash for v in reference.published}
    assert len(set(expected.values())) == 4 and all(h.startswith("sha256:") for h in expected.values())

    crashing = _AuditingPublisher(tmp_path / "run" / "ckpt", crash_at=3)
    with pytest.raises(_Crash):
        _trainer(tmp_path / "run", crashing).run(4)
    restarted = _AuditingPublisher(tmp_path / "run" / "ckpt")
    resumed = _trainer(tmp_path / "run", restarted)
    assert resumed.step_count == 3 and resumed.published_version == 2
    results = resumed.run(4)
    assert [r.step for r in results] == [4]  # batch 3 is in the checkpoint: not trained again
    announced = [*crashing.published, *restarted.published]
    assert [v.version for v in announced] == [1, 2, 3, 4]
    assert {v.version: v.content_hash for v in announced} == expected


def test_content_hash_depends_on_values_not_key_order() -> None:
    a = {"x": torch.ones(2, 3), "y": torch.zeros(1, dtype=torch.bfloat16)}
    b = {"y": torch.zeros(1, dtype=torch.bfloat16), "x": torch.ones(2, 3)}
    assert content_hash(a) == content_hash(b)
    b["x"][0, 0] = 2.0
    assert content_hash(a) != content_hash(b)


class _CollectiveRecorder(Backend):
    """Single-process backend that records barriers and the close mode."""

    def __init__(self) -> None:
        super().__init__(tiny_trainer_config("sft").backend)
        self.barriers = 0
        self.closed_graceful: bool | None = None

    def barrier(self) -> None:
        self.barriers += 1

    def close(self, *, graceful: bool = True) -> None:
        self.closed_graceful = graceful
        if graceful:
            self.barrier()


class _InterruptingSource(InMemoryBatchSource):
    def poll(self, timeout_s: float) -> None:  # type: ignore[override]
        raise KeyboardInterrupt


def test_an_interrupted_run_closes_without_a_collective() -> None:
    backend = _CollectiveRecorder()
    config = tiny_trainer_config("sft")
    with pytest.raises(KeyboardInterrupt), StacxTrainer(
            config, source=_InterruptingSource([]), backend=backend) as trainer:
        trainer.run(1)
    assert backend.closed_graceful is False and backend.barriers == 0


def test_fsdp_close_after_an_interrupt_runs_no_barrier(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    from stacx.trainer.backends.fsdp import FSDP2Backend

    calls: list[str] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: calls.append("barrier"))
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a, **k: calls.append("destroy"))
    backend = FSDP2Backend.__new__(FSDP2Backend)
    backend._owns_group = True
    backend.close(graceful=False)
    assert calls == []
    backend.close()
    assert calls == ["barrier", "destroy"]


def test_a_crash_after_the_announcement_does_not_announce_it_again(tmp_path: Path) -> None:
    first = InMemoryWeightPublisher()
    _trainer(tmp_path, first).run(2)  # checkpoint 2 was written before v2 went out
    second = InMemoryWeightPublisher()
    resumed = _trainer(tmp_path, second)
    assert resumed.published_version == 2
    resumed.run(3)
    assert [v.version for v in [*first.published, *second.published]] == [1, 2, 3]


def test_the_announcement_waits_as_long_as_the_producer_retries() -> None:
    """A broker restarting while a version is announced costs a wait, not the trainer: the
    delivery report is awaited for the producer's whole delivery timeout, not a shorter one."""
    from types import SimpleNamespace

    from stacx.trainer.publish import KafkaWeightPublisher

    waited: list[float] = []
    future = SimpleNamespace(result=lambda timeout: waited.append(timeout))
    publisher = KafkaWeightPublisher.__new__(KafkaWeightPublisher)
    publisher.topic = "weights"
    publisher.producer = SimpleNamespace(config=SimpleNamespace(delivery_timeout_ms=120_000),
                                         publish=lambda topic, record, key: future)
    publisher.publish(WeightVersion(model_name="m", version=1, path="/w/v1", step=1))
    assert waited and waited[0] >= 120
