"""`stacx tasks import` and the argument wiring of the sandbox commands (no Docker needed)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from stacx.infra.cli import build_parser
from stacx.infra.commands import sandbox as commands
from stacx.rollout.data import load_tasks_jsonl
from stacx.sandbox.checks import check_path

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "tasks"


def test_tasks_import_writes_loadable_task_samples(tmp_path: Path) -> None:
    output = tmp_path / "out" / "tasks.jsonl"
    args = build_parser().parse_args(["tasks", "import", str(EXAMPLES), "-o", str(output)])
    assert args.func(args) == 0
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(rows) == 6 and {r["task_type"] for r in rows} >= {"coding", "shell", "data"}
    samples = load_tasks_jsonl(output)
    assert samples[0].task_dir and Path(samples[0].task_dir, "task.toml").is_file()


def test_tasks_import_reports_broken_tasks(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "task.toml").write_text("[task]\nname = 'x'\n")
    args = build_parser().parse_args(["tasks", "import", str(tmp_path), "-o", str(tmp_path / "o.jsonl")])
    assert args.func(args) == 1
    assert "instruction.md is missing" in capsys.readouterr().err


def test_gateway_arguments() -> None:
    from stacx.infra.commands.sandbox import gateway_config

    args = build_parser().parse_args(
        ["gateway", "--backend", "process", "--port", "9", "--warm-pool", "2", "--reuse-pool", "3"]
    )
    config = gateway_config(args)
    assert (config.backend, config.port, config.sessions.warm_pool_size, config.sessions.reuse_pool_size) == (
        "process",
        9,
        2,
        3,
    )
    assert config.auth and config.host == "127.0.0.1" and config.sessions.owner == "stacx-gateway"


def test_gateway_limits_reach_the_session_manager() -> None:
    from stacx.infra.commands.sandbox import gateway_config

    args = build_parser().parse_args(["gateway", "--max-pids", "64", "--budget-memory-mb", "2048"])
    limits = gateway_config(args).sessions.limits
    assert (limits.max_pids, limits.budget_memory_mb, limits.max_cpus) == (64, 2048, None)


def test_gateway_reads_its_section_from_a_file_and_flags_override_it(tmp_path: Path) -> None:
    from stacx.infra.commands.sandbox import gateway_config

    path = tmp_path / "gateway.yaml"
    path.write_text(
        "gateway:\n  port: 8799\n  backend: process\n  auth: false\n"
        "  sessions: {owner: mine, reuse_pool_size: 5, limits: {max_pids: 128}}\n"
    )
    config = gateway_config(build_parser().parse_args(["gateway", "--config", str(path), "--port", "8800"]))
    assert (config.port, config.backend, config.auth) == (8800, "process", False)
    assert (config.sessions.owner, config.sessions.reuse_pool_size, config.sessions.limits.max_pids) == (
        "mine",
        5,
        128,
    )


def test_a_bad_gateway_section_is_one_line_per_field_and_exit_2(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "gateway.yaml"
    path.write_text("gateway:\n  port: high\n  sessions: {reuse_pool: 5}\n")
    args = build_parser().parse_args(["gateway", "--config", str(path)])
    assert args.func(args) == 2
    lines = capsys.readouterr().err.splitlines()
    assert sorted(lines) == [
        f"stacx gateway: {path}: gateway.port: expected a valid integer, got 'high'",
        next(line for line in lines if "gateway.sessions.reuse_pool: unknown field; valid fields:" in line),
    ]


def test_gateway_limits_beyond_the_host_are_one_line_and_exit_2(capsys) -> None:  # type: ignore[no-untyped-def]
    args = build_parser().parse_args(["gateway", "--backend", "process", "--budget-pids", "99999999"])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "limits.budget_pids=99999999 leaves the host fewer than" in err


def test_eval_skips_broken_and_unsupported_harbor_tasks(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    import shutil

    from stacx.infra.commands.rollout import _harbor_tasks

    shutil.copytree(EXAMPLES / "write-file", tmp_path / "good")
    shutil.copytree(EXAMPLES / "write-file", tmp_path / "gpu")
    (tmp_path / "gpu" / "task.toml").write_text("[task]\nname = 'gpu'\n[environment]\ngpus = 2\n")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "task.toml").write_text("[task]\nname = 'x'\n")
    samples = _harbor_tasks(str(tmp_path))
    assert [s.task_id for s in samples] == ["stacx-write-file"]
    err = capsys.readouterr().err
    assert "skipped gpu: needs 2 GPU(s)" in err and "instruction.md is missing" in err


def test_tasks_check_reports_broken_and_unsupported_tasks_one_by_one(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "task.toml").write_text("[environment]\nmemory = 'lots'\n")
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "task.toml").write_text("[environment]\ngpus = 1\n")
    (tmp_path / "gpu" / "instruction.md").write_text("x")
    (tmp_path / "gpu" / "tests").mkdir()
    (tmp_path / "gpu" / "tests" / "test.sh").write_text("true")
    (tmp_path / "gpu" / "environment").mkdir()
    (tmp_path / "gpu" / "environment" / "Dockerfile").write_text("FROM scratch")
    rows = [asyncio.run(check_path(None, d)) for d in sorted(tmp_path.iterdir())]  # type: ignore[arg-type]
    by_name = {r.path.rsplit("/", 1)[-1]: r for r in rows}
    assert "memory must be a size" in (by_name["bad"].error or "")
    assert by_name["gpu"].error == "not supported: needs 1 GPU(s); sandboxes have none"
    assert not any(r.passed for r in rows)
    assert commands._base_images(["ubuntu:24.04=mine:1"])["ubuntu:24.04"] == "mine:1"
    with pytest.raises(ValueError, match="FROM=LOCAL"):
        commands._base_images(["ubuntu"])
