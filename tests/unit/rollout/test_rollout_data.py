"""DataSource: epochs, seeded shuffle, groups of n samples with deterministic ids."""

from __future__ import annotations

import json
from pathlib import Path

from stacx.rollout.data import JsonlTaskSource, ListTaskSource
from stacx.rollout.protocols import TaskGroup


async def _all(source: ListTaskSource) -> list[TaskGroup]:
    groups = []
    while (group := await source.next_group()) is not None:
        groups.append(group)
    return groups


def _write(tmp_path: Path, num: int) -> Path:
    path = tmp_path / "tasks.jsonl"
    rows = [
        {"task_id": f"t{i}", "task_type": "math", "prompt": f"q{i}", "data": {"answer": i}}
        for i in range(num)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


async def test_epochs_and_group_size(tmp_path: Path) -> None:
    config = ListTaskSource.Config(samples_per_task=4, epochs=2)
    groups = await _all(JsonlTaskSource(_write(tmp_path, 3), config))
    assert [g.task.task_id for g in groups] == ["t0", "t1", "t2"] * 2
    assert [g.epoch for g in groups] == [0, 0, 0, 1, 1, 1]
    assert {g.num_samples for g in groups} == {4}
    assert len({g.group_id for g in groups}) == 6
    assert json.loads(groups[1].task.data) == {"answer": 1}


async def test_seeded_shuffle_is_reproducible_and_differs_per_epoch(tmp_path: Path) -> None:
    path = _write(tmp_path, 20)
    config = ListTaskSource.Config(epochs=2, shuffle=True, seed=3)
    first = [(g.task.task_id, g.group_id) for g in await _all(JsonlTaskSource(path, config))]
    again = [(g.task.task_id, g.group_id) for g in await _all(JsonlTaskSource(path, config))]
    assert first == again
    epoch0, epoch1 = [t for t, _ in first[:20]], [t for t, _ in first[20:]]
    assert sorted(epoch0) == sorted(epoch1) and epoch0 != epoch1
    other = ListTaskSource.Config(epochs=2, shuffle=True, seed=4)
    assert [t for t, _ in first] != [g.task.task_id for g in await _all(JsonlTaskSource(path, other))]


async def test_forever_source_keeps_going(tmp_path: Path) -> None:
    source = JsonlTaskSource(_write(tmp_path, 2), ListTaskSource.Config(epochs=0))
    groups = [await source.next_group() for _ in range(7)]
    assert all(g is not None for g in groups) and groups[6].epoch == 3  # type: ignore[union-attr]
