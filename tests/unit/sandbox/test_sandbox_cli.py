"""`stacx tasks import` and the argument wiring of the sandbox commands (no Docker needed)."""

from __future__ import annotations

import json
from pathlib import Path

from infra.cli import build_parser
from rollout.data import load_tasks_jsonl

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
    args = build_parser().parse_args(["gateway", "--backend", "process", "--port", "9", "--warm-pool", "2"])
    assert (args.backend, args.port, args.warm_pool, args.no_auth) == ("process", 9, 2, False)
