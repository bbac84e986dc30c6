"""KernelBench's check (correctness, then speedup) as the sandbox runs it: the harness script on
stdin of a fresh python3 with real torch (CPU here), on the level1 sample and candidates written
for it; and the verifier that ships the harness into the sandbox."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stacx.infra.benchmarks import build_suite
from stacx.infra.benchmarks.kernelbench import CANDIDATE, HARNESS, REFERENCE, kernelbench_verifier
from stacx.rollout.protocols import ExecResult

SAMPLES = Path(__file__).resolve().parents[2] / "benchmark_samples" / "kernelbench"
REFERENCE_FILE = SAMPLES / "KernelBench" / "level1" / "1_Scaled_add.py"


def _check(candidate: Path, precision: str = "fp32") -> tuple[dict[str, float], str]:
    done = subprocess.run([sys.executable, "-", str(REFERENCE_FILE), str(candidate), "--runs", "3",
                           "--precision", precision],
                          input=HARNESS.read_text(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_a_correct_candidate_is_timed_against_the_reference() -> None:
    result, _ = _check(SAMPLES / "candidates" / "right.py")
    assert result["compiled"] == 1.0 and result["correct"] == 1.0 and result["speedup"] > 0.0


def test_a_wrong_candidate_is_not_timed() -> None:
    result, err = _check(SAMPLES / "candidates" / "wrong.py")
    assert result == {"compiled": 1.0, "correct": 0.0, "speedup": 0.0}
    assert "differs from the reference on trial 0" in err


def test_the_tolerance_is_kernelbenchs_current_one_per_precision() -> None:
    # 0.1 % off: passed KernelBench v0.1's fp32 1e-2, fails its current fp32 1e-4, passes bf16's 1e-2
    close = SAMPLES / "candidates" / "close.py"
    result, err = _check(close)
    assert result["correct"] == 0.0 and "differs from the reference on trial 0" in err
    assert _check(close, "bf16")[0]["correct"] == 1.0
    assert _check(SAMPLES / "candidates" / "right.py", "bf16")[0]["correct"] == 1.0


def test_a_candidate_that_does_not_build_scores_zero(tmp_path: Path) -> None:
    broken = tmp_path / "model_new.py"
    broken.write_text("class ModelNew(:\n")
    result, err = _check(broken)
    assert result == {"compiled": 0.0, "correct": 0.0, "speedup": 0.0} and "SyntaxError" in err


@dataclass
class RecordingSession:
    stdout: str
    session_id: str = "fake"
    commands: list[tuple[str, str | None]] = field(default_factory=list)

    async def exec(
        self, command: str, *, stdin: str | None = None, timeout_s: float | None = None
    ) -> ExecResult:
        self.commands.append((command, stdin))
        return ExecResult(exit_code=0, stdout=self.stdout if "python3" in command else "")

    async def verify(self) -> dict[str, float]:
        raise AssertionError("the kernelbench verifier runs its own check")

    async def close(self) -> None:
        return None


async def test_the_verifier_ships_the_reference_and_the_harness_and_reads_its_verdict() -> None:
    task = build_suite("kernelbench").load(SAMPLES).tasks[0]
    session = RecordingSession('noise\n{"compiled": 1.0, "correct": 1.0, "speedup": 2.5}\n')
    assert await kernelbench_verifier(session, task) == {"reward": 1.0, "correct": 1.0, "compiled": 1.0,
                                                         "speedup": 2.5}
    assert session.commands[0] == (f"cat > {REFERENCE}", REFERENCE_FILE.read_text())
    assert session.commands[1] == (f"python3 - {REFERENCE} {CANDIDATE} --precision fp32", HARNESS.read_text())
    half = RecordingSession('{"compiled": 1.0, "correct": 1.0, "speedup": 1.0}')
    await kernelbench_verifier(half, task, precision="bf16")  # verifier_options: {precision: bf16}
    assert half.commands[1][0].endswith("--precision bf16")
    with pytest.raises(ValueError, match="precision 'fp8'; use one of fp32, fp16, bf16"):
        await kernelbench_verifier(half, task, precision="fp8")
    no_torch = RecordingSession("ModuleNotFoundError: No module named 'torch'\n")
    assert await kernelbench_verifier(no_torch, task) == {"reward": 0.0, "correct": 0.0, "compiled": 0.0,
                                                          "speedup": 0.0}
