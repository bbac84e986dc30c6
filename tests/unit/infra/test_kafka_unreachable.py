"""Kafka unreachable: `stacx assemble`, `stacx train` and `stacx rollout` say so in one line and stop (exit 1)
within a bounded wait, and `stacx run` stops in its preflight before starting anything, each with
none of librdkafka's per-attempt FAIL lines."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _stacx(args: list[str], cwd: Path) -> tuple[int, list[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "stacx.infra.cli", *args],
        cwd=REPO, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return done.returncode, lines, time.monotonic() - started


def _rollout_config(tmp_path: Path, bootstrap: str) -> Path:
    """The shipped arithmetic rollout config on `bootstrap`, with a tiny tokenizer of its own."""
    import yaml

    tokenizer = tmp_path / "tiny"
    subprocess.run([sys.executable, "-m", "stacx.infra.cli", "models", "tiny", "--out", str(tokenizer)],
                   cwd=REPO, check=True, capture_output=True, timeout=120)
    shipped = REPO / "examples" / "rollout"
    cfg = yaml.safe_load((shipped / "arithmetic.yaml").read_text())
    cfg["data"]["path"] = str(shipped / cfg["data"]["path"])
    cfg["inference"]["tokenizer"] = str(tokenizer)
    cfg["kafka"]["bootstrap_servers"] = bootstrap
    config = tmp_path / "rollout.yaml"
    config.write_text(yaml.safe_dump(cfg))
    return config


@pytest.mark.parametrize("command", ["assemble", "train", "rollout"])
def test_an_unreachable_broker_is_one_line_and_exit_1(command: str, tmp_path: Path) -> None:
    bootstrap = f"127.0.0.1:{_unused_port()}"
    if command == "assemble":
        args = ["assemble", "--bootstrap_servers", bootstrap]
    elif command == "rollout":  # before any episode starts, not 15 s per failed publish
        args = ["rollout", str(_rollout_config(tmp_path, bootstrap)), "--progress", "false"]
    else:
        config = tmp_path / "trainer.yaml"
        config.write_text("recipe: grpo\nmodels: {policy: {tiny: {}}}\n")
        args = ["train", str(config), "--source.bootstrap_servers", bootstrap,
                "--export.bootstrap_servers", bootstrap]
    code, lines, wall_s = _stacx(args, tmp_path)
    assert code == 1, lines
    assert not [line for line in lines if "FAIL" in line or "Traceback" in line], lines
    expected = f"stacx {command}: Kafka at {bootstrap} did not answer within 10s"
    assert [line for line in lines if line.startswith(expected)], lines
    assert lines[-1].startswith(expected), lines
    assert wall_s < 100  # the 10 s check plus start-up (torch for train) on a loaded machine


def test_run_stops_in_preflight_without_librdkafka_lines_or_a_run_folder(tmp_path: Path) -> None:
    import yaml

    bootstrap = f"127.0.0.1:{_unused_port()}"
    cfg = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    cfg["bootstrap_servers"] = bootstrap
    cfg["pipeline"]["plugin_paths"] = [str(REPO / "examples")]
    config = tmp_path / "quickstart.yaml"
    config.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    code, lines, _ = _stacx(["run", str(config), "--no-live", "--runs-dir", str(runs)], tmp_path)
    assert code == 2, lines
    assert not [line for line in lines if "FAIL" in line or "Traceback" in line], lines
    assert lines[0] == "stacx run: the pipeline cannot run; missing:", lines
    assert [line for line in lines if f"Kafka at {bootstrap} did not answer" in line], lines
    assert not runs.exists(), "nothing started: no run folder"
