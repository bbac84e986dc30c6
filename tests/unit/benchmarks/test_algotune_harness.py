"""AlgoTune's check (validity, then speedup) as the sandbox runs it: the harness script on stdin
of a fresh python3, on the sample task and solvers written for it; and the verifier."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stacx.infra.benchmarks import build_suite
from stacx.infra.benchmarks.algotune import HARNESS, SOLVER, TASK_FILE, algotune_verifier
from stacx.rollout.protocols import ExecResult

SAMPLES = Path(__file__).resolve().parents[2] / "benchmark_samples" / "algotune"
TASK = SAMPLES / "AlgoTuneTasks" / "vector_norm" / "vector_norm.py"


def _check(solver: Path) -> tuple[dict[str, float], str]:
    done = subprocess.run([sys.executable, "-", str(TASK), str(solver), "--problems", "2", "--runs", "2"],
                          input=HARNESS.read_text(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_a_valid_solver_is_timed_against_the_reference() -> None:
    result, _ = _check(SAMPLES / "solvers" / "right.py")
    assert result["valid"] == 1.0 and result["speedup"] > 0.0


def test_a_wrong_or_broken_solver_is_invalid(tmp_path: Path) -> None:
    result, err = _check(SAMPLES / "solvers" / "wrong.py")
    assert result == {"valid": 0.0, "speedup": 0.0} and "fails is_solution" in err
    broken = tmp_path / "solver.py"
    broken.write_text("import no_such_module\n")
    result, err = _check(broken)
    assert result == {"valid": 0.0, "speedup": 0.0} and "ModuleNotFoundError" in err


class Session:
    def __init__(self, stdout: str) -> None:
        self.stdout, self.session_id = stdout, "fake"
        self.commands: list[tuple[str, str | None]] = []

    async def exec(
        self, command: str, *, stdin: str | None = None, timeout_s: float | None = None
    ) -> ExecResult:
        self.commands.append((command, stdin))
        return ExecResult(exit_code=0, stdout=self.stdout if "python3" in command else "")

    async def verify(self) -> dict[str, float]:
        raise AssertionError("the algotune verifier runs its own check")

    async def close(self) -> None:
        return None


async def test_the_verifier_ships_the_task_and_the_harness_and_reads_its_verdict() -> None:
    task = build_suite("algotune").load(SAMPLES).tasks[0]
    session = Session('{"valid": 1.0, "speedup": 3.0}\n')
    assert await algotune_verifier(session, task) == {"reward": 3.0, "valid": 1.0, "speedup": 3.0}
    assert session.commands == [(f"cat > {TASK_FILE}", TASK.read_text()),
                                (f"python3 - {TASK_FILE} {SOLVER}", HARNESS.read_text())]
    failed = Session("Traceback ...\nImportError: AlgoTuneTasks\n")
    assert await algotune_verifier(failed, task) == {"reward": 0.0, "valid": 0.0, "speedup": 0.0}
