"""SWE-bench Verified: the instances file (JSONL / JSON / Parquet with `instance_id`, `repo`,
`base_commit`, `problem_statement`, `test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS`) and one
environment image per instance that the user built with the SWE-bench harness
(`sweb.eval.x86_64.<instance id>:latest`, the repository checked out at `/testbed`).

The suite's rule: an instance is resolved when every FAIL_TO_PASS test passes and every
PASS_TO_PASS test still passes after the agent's edits (`resolved`). The `swebench` verifier
applies the instance's test patch in the sandbox, runs the named tests with pytest (`-rA`) and
applies that rule to the report; repositories whose tests run under another runner (django's
`runtests.py`, sympy's `bin/test`) need their own verifier.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stacx.infra.benchmarks.protocols import LoadedSuite, SuiteScore, TaskOutcome
from stacx.infra.benchmarks.registry import BENCHMARKS
from stacx.infra.benchmarks.rows import data_files, read_rows
from stacx.infra.benchmarks.scoring import rate_score
from stacx.rollout.protocols import EnvironmentSession
from stacx.rollout.rewards import VERIFIERS
from stacx.schemas.records import TaskSample

__all__ = ["SweBenchVerified", "parse_pytest_report", "resolved", "swebench_verifier"]

REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "test_patch",
            "FAIL_TO_PASS", "PASS_TO_PASS")
REPO_DIR = "/testbed"
"""Where the SWE-bench environment images hold the repository."""
_STATUS = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+)", re.MULTILINE)
_PASSING = {"PASSED", "XFAIL"}
_ORIGIN = "builtin (stacx.infra.benchmarks.swebench)"


def resolved(fail_to_pass: Sequence[str], pass_to_pass: Sequence[str], status: Mapping[str, str]) -> bool:
    """SWE-bench's rule: every FAIL_TO_PASS and every PASS_TO_PASS test passed (a test missing
    from the report did not pass)."""
    return all(status.get(test) in _PASSING for test in [*fail_to_pass, *pass_to_pass])


def parse_pytest_report(text: str) -> dict[str, str]:
    """Test id -> status from pytest's `-rA` short summary (`PASSED tests/test_x.py::test_a`)."""
    return {test: word for word, test in _STATUS.findall(text)}


def _test_list(value: Any) -> list[str] | None:
    """The tests of a FAIL_TO_PASS / PASS_TO_PASS field: a list, or a JSON-encoded list."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return value
    return None


def _test_files(test_patch: str) -> list[str]:
    return sorted(set(re.findall(r"^\+\+\+ b/(\S+)", test_patch, re.MULTILINE)))


@VERIFIERS.register("swebench", origin=_ORIGIN)
async def swebench_verifier(session: EnvironmentSession, task: TaskSample) -> dict[str, float]:
    """Apply the test patch in /testbed, run the patched test files with pytest, score the
    report by `resolved`; also the fractions of FAIL_TO_PASS and PASS_TO_PASS that pass."""
    data = json.loads(task.data)
    applied = await session.exec(f"cd {REPO_DIR} && git apply -v -", stdin=data["test_patch"], timeout_s=120)
    if applied.exit_code != 0:
        return {"reward": 0.0, "fail_to_pass": 0.0, "pass_to_pass": 0.0, "patch_applied": 0.0}
    files = " ".join(shlex.quote(f) for f in _test_files(data["test_patch"]))
    report = await session.exec(f"cd {REPO_DIR} && python -m pytest -rA {files}", timeout_s=1800)
    status = parse_pytest_report(report.stdout)
    f2p, p2p = data["FAIL_TO_PASS"], data["PASS_TO_PASS"]
    return {
        "reward": float(resolved(f2p, p2p, status)),
        "fail_to_pass": _fraction(f2p, status),
        "pass_to_pass": _fraction(p2p, status),
        "patch_applied": 1.0,
    }


def _fraction(tests: Sequence[str], status: Mapping[str, str]) -> float:
    return sum(status.get(t) in _PASSING for t in tests) / len(tests) if tests else 1.0


@BENCHMARKS.register("swe-bench-verified", origin=_ORIGIN)
class SweBenchVerified:
    """SWE-bench Verified: 500 GitHub issues; resolved rate by FAIL_TO_PASS / PASS_TO_PASS."""

    name = "swe-bench-verified"
    metric = "resolved rate (FAIL_TO_PASS and PASS_TO_PASS all pass)"
    layout = "instances JSONL/Parquet (instance_id, FAIL_TO_PASS, ...) + locally built images"
    task_type = "swe-bench-verified"
    scaffold = "terminal"
    reward = "verifier"
    verifier = "swebench"

    def load(self, path: Path) -> LoadedSuite:
        files = data_files(path)
        if not files:
            return LoadedSuite([], [f"{path}: no instances file (.jsonl, .json or .parquet)"])
        tasks: list[TaskSample] = []
        problems: list[str] = []
        for file in files:
            for where, row in read_rows(file):
                task = self._task(row) if isinstance(row, dict) else row
                if isinstance(task, TaskSample):
                    tasks.append(task)
                else:
                    problems.append(f"{where}: {task}")
        return LoadedSuite(tasks, problems)

    def _task(self, row: dict[str, Any]) -> TaskSample | str:
        missing = [f for f in REQUIRED if row.get(f) in (None, "")]
        if missing:
            return f"missing field(s) {missing}; an instance has {list(REQUIRED)}; skipped"
        f2p, p2p = _test_list(row["FAIL_TO_PASS"]), _test_list(row["PASS_TO_PASS"])
        if f2p is None or p2p is None:
            field = "FAIL_TO_PASS" if f2p is None else "PASS_TO_PASS"
            return f"{field} is not a list of test ids (nor a JSON-encoded one); skipped"
        instance_id = str(row["instance_id"])
        data = {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "test_patch": row["test_patch"],
                "repo": row["repo"], "base_commit": row["base_commit"]}
        return TaskSample(
            task_id=instance_id,
            task_type=self.task_type,
            prompt=f"Resolve this issue in the repository at {REPO_DIR}:\n\n{row['problem_statement']}",
            data=json.dumps(data),
            image=f"sweb.eval.x86_64.{instance_id.lower()}:latest",
            metadata={"suite": self.name, "repo": str(row["repo"])},
        )

    def prepare(self, path: Path) -> list[str]:
        return self.load(path).readiness(
            f"{path}: holds no instances; point --from at SWE-bench Verified's instances file")

    def score(self, outcomes: Sequence[TaskOutcome], *, k: int) -> SuiteScore:
        return rate_score(outcomes, metric="resolved rate", k=k)
