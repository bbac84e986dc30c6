"""Harbor task loading, discovery, image tags and TaskSample normalisation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from stacx.sandbox.errors import TaskFormatError
from stacx.sandbox.images import from_images
from stacx.sandbox.tasks import discover_tasks, load_task, to_task_sample

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "tasks"
BUILTIN = ["edit-config", "fix-python-bug", "json-to-csv", "sort-files", "top-ips", "write-file"]


def _copy(tmp_path: Path, name: str = "write-file") -> Path:
    target = tmp_path / name
    shutil.copytree(EXAMPLES / name, target)
    return target


def test_every_builtin_task_loads() -> None:
    tasks = discover_tasks(EXAMPLES)
    assert [t.path.name for t in tasks] == BUILTIN
    for task in tasks:
        assert task.instruction.strip()
        assert task.has_solution
        assert not task.wants_internet
        assert task.verifier_timeout_s > 0 and task.memory_mb == 512
        assert from_images(task.dockerfile) == ["stacx/sandbox:bookworm"]


def test_task_fields_come_from_task_toml() -> None:
    task = load_task(EXAMPLES / "fix-python-bug")
    assert task.name == "stacx/fix-python-bug"
    assert task.slug == "stacx-fix-python-bug"
    assert task.verifier_timeout_s == 60.0 and task.agent_timeout_s == 300.0
    assert task.metadata["category"] == "coding"


def test_image_tag_follows_environment_content(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    before = load_task(root).image_tag
    assert before == load_task(root).image_tag
    assert before.startswith("stacx-task/stacx-write-file:")
    (root / "environment" / "Dockerfile").write_text("FROM stacx/sandbox:bookworm\nRUN true\n")
    assert load_task(root).image_tag != before


@pytest.mark.parametrize(
    ("remove", "message"),
    [
        ("task.toml", "task.toml is missing"),
        ("instruction.md", "instruction.md is missing"),
        ("tests/test.sh", "tests/test.sh is missing"),
        ("environment/Dockerfile", "environment/Dockerfile is missing"),
    ],
)
def test_missing_files_are_named(tmp_path: Path, remove: str, message: str) -> None:
    root = _copy(tmp_path)
    (root / remove).unlink()
    with pytest.raises(TaskFormatError, match=message):
        load_task(root)


def test_bad_toml_and_bad_fields_are_named(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "task.toml").write_text("[verifier\n")
    with pytest.raises(TaskFormatError, match="invalid TOML"):
        load_task(root)
    (root / "task.toml").write_text("[verifier]\ntimeout_sec = -1\n")
    with pytest.raises(TaskFormatError, match=r"\[verifier\] timeout_sec must be a positive number"):
        load_task(root)


def test_internet_request_is_recorded(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "task.toml").write_text("[environment]\nallow_internet = true\n")
    task = load_task(root)
    assert task.wants_internet and task.name == "write-file"


def test_discovery_reports_every_broken_task(tmp_path: Path) -> None:
    _copy(tmp_path, "write-file")
    broken_a, broken_b = _copy(tmp_path, "top-ips"), _copy(tmp_path, "sort-files")
    (broken_a / "instruction.md").unlink()
    (broken_b / "tests" / "test.sh").unlink()
    with pytest.raises(TaskFormatError) as info:
        discover_tasks(tmp_path)
    assert "top-ips" in str(info.value) and "sort-files" in str(info.value)


def test_empty_directory_has_no_tasks(tmp_path: Path) -> None:
    with pytest.raises(TaskFormatError, match="no task.toml"):
        discover_tasks(tmp_path)


def test_task_sample_carries_what_the_rollout_needs() -> None:
    task = load_task(EXAMPLES / "top-ips")
    sample = to_task_sample(task)
    assert sample.task_id == "stacx-top-ips"
    assert sample.task_type == "shell"
    assert sample.prompt == task.instruction
    assert sample.task_dir == str(task.path)
    assert sample.image == task.image_tag
    assert json.loads(sample.data)["verifier_timeout_s"] == 30.0
    assert json.loads(sample.metadata["tags"]) == ["awk", "sort", "text-processing"]


def test_from_images_skips_stages_args_and_scratch(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "ARG BASE=x\nFROM --platform=linux/amd64 golang:1 AS build\nFROM build\n"
        "FROM $BASE\nFROM scratch\nfrom stacx/sandbox:bookworm\n"
    )
    assert from_images(dockerfile) == ["golang:1", "stacx/sandbox:bookworm"]
