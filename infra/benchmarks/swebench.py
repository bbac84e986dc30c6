"""SWE-bench Verified, graded by the `swebench` package (5.x) itself.

Input: the instances file of the SWE-bench dataset release that `swebench` 5.x evaluates (JSONL /
JSON / Parquet). Besides `instance_id`, `repo`, `base_commit`, `problem_statement`, `test_patch`,
`FAIL_TO_PASS` and `PASS_TO_PASS`, each row carries the harness's test spec: `version`, `image`
(the environment image, the repository at `/testbed`), `eval_script` (activate the `testbed`
environment, the repository's install and eval commands, reset the test files to the base commit,
apply the test patch, run the repository's own test command on its test files, reset again),
`log_parser` (django's, sympy's, pytest's, ... by name) and `eval_type`.

The verifier runs the instance's eval script in the episode's sandbox, after the agent's edits,
exactly as `swebench.harness.run_evaluation` runs it in the instance container, and grades the
output with `swebench.harness.grading.get_eval_report`: the repository's log parser, the exit-code
cross-check, FAIL_TO_PASS / PASS_TO_PASS (a skipped PASS_TO_PASS test is maintained). Nothing of
the grading is ours.
"""

from __future__ import annotations

import base64
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stacx.infra.benchmarks.protocols import LoadedSuite, SuiteScore, TaskOutcome
from stacx.infra.benchmarks.registry import BENCHMARKS
from stacx.infra.benchmarks.rows import data_files, read_rows
from stacx.infra.benchmarks.scoring import rate_score
from stacx.rollout.protocols import EnvironmentSession
from stacx.rollout.rewards import VERIFIERS
from stacx.schemas.records import TaskSample

if TYPE_CHECKING:
    from swebench.types import TestSpec

__all__ = ["SweBenchVerified", "grade_log", "instance_spec", "run_eval_script", "swebench_verifier"]

REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "test_patch",
            "FAIL_TO_PASS", "PASS_TO_PASS")
SPEC_FIELDS = ("version", "image", "eval_script", "log_parser", "eval_type")
"""The test-spec columns of the dataset release `swebench` 5.x grades (`make_test_spec` reads them)."""
REPO_DIR = "/testbed"
"""Where the SWE-bench environment images hold the repository."""
EVAL_TIMEOUT_S = 1800.0
"""The harness's default `--timeout` for one instance's eval script."""
EVAL_FILE = "/tmp/stacx-swebench-eval.sh"
LOG_FILE = "/tmp/stacx-swebench-test-output.txt"
_CHUNK = 512 * 1024
"""Bytes of the test output read back per exec (base64 keeps it under the sandbox's output cap)."""
_ORIGIN = "builtin (stacx.infra.benchmarks.swebench)"
_INSTALL = "the swebench package is not installed: pip install 'stacx[swebench]'"


class SweBenchMissing(RuntimeError):
    """`swebench` (the harness's own grader) is not importable here."""


def _harness() -> Any:
    try:
        from swebench.harness import grading, utils
    except ImportError as exc:
        raise SweBenchMissing(_INSTALL) from exc
    return grading, utils


def instance_spec(instance: dict[str, Any]) -> TestSpec:
    """The harness's `TestSpec` of one instance (`swebench.harness.utils.make_test_spec`), with
    its eval script made to record the test command's exit code."""
    _, utils = _harness()
    return utils.make_test_spec(instance)


def grade_log(spec: TestSpec, log: str) -> dict[str, float]:
    """Grade the output of `spec`'s eval script with `swebench.harness.grading.get_eval_report`:
    `reward` 1 when resolved; the fractions of FAIL_TO_PASS and PASS_TO_PASS that pass; and
    `tests_ran` 0 when the log holds no usable test run (test patch failed, timed out, the
    exit-code cross-check refused it)."""
    grading, _ = _harness()
    prediction = {"instance_id": spec.instance_id, "model_patch": "", "model_name_or_path": "stacx"}
    with tempfile.TemporaryDirectory(prefix="stacx-swebench-") as tmp:
        path = Path(tmp) / "test_output.txt"
        path.write_text(log, encoding="utf-8")
        report = grading.get_eval_report(spec, prediction, str(path), include_tests_status=True)
    verdict = report[spec.instance_id]
    tests = verdict.get("tests_status")
    return {
        "reward": float(verdict["resolved"]),
        "fail_to_pass": float(grading.compute_fail_to_pass(tests)) if tests else 0.0,
        "pass_to_pass": float(grading.compute_pass_to_pass(tests)) if tests else 0.0,
        "tests_ran": float(verdict["patch_successfully_applied"]),
    }


async def run_eval_script(session: EnvironmentSession, spec: TestSpec,
                          timeout_s: float = EVAL_TIMEOUT_S) -> str:
    """Run `spec.eval_script` in the sandbox as the harness runs it in the instance container
    (`/bin/bash eval.sh`, stdout and stderr in one log) and return that log; on a timeout the log
    ends with the harness's timeout marker, as `run_evaluation` writes it."""
    from swebench.harness.constants import TESTS_TIMEOUT

    await session.exec(f"cat > {EVAL_FILE}", stdin=spec.eval_script, timeout_s=60)
    result = await session.exec(f"/bin/bash {EVAL_FILE} > {LOG_FILE} 2>&1", timeout_s=timeout_s)
    log = await _read_back(session, LOG_FILE)
    if result.timed_out:
        log += f"\n\n{TESTS_TIMEOUT} after {timeout_s:g} seconds\n"
    return log


async def _read_back(session: EnvironmentSession, path: str) -> str:
    """The whole file at `path` in the sandbox, in base64 chunks under the exec output cap."""
    size = await session.exec(f"stat -c %s {path}", timeout_s=60)
    total = int(size.stdout.strip() or 0) if size.exit_code == 0 else 0
    data = bytearray()
    for offset in range(0, total, _CHUNK):
        part = await session.exec(f"tail -c +{offset + 1} {path} | head -c {_CHUNK} | base64 -w0",
                                  timeout_s=120)
        data += base64.b64decode(part.stdout.strip() or b"")
    return data.decode("utf-8", errors="replace")


@VERIFIERS.register("swebench", origin=_ORIGIN)
async def swebench_verifier(session: EnvironmentSession, task: TaskSample, *,
                            timeout_s: float = EVAL_TIMEOUT_S) -> dict[str, float]:
    """Run the instance's eval script in the sandbox (after the agent's edits) and grade its log
    with the harness's `get_eval_report`; `timeout_s` (`verifier_options`) bounds the script."""
    spec = instance_spec(json.loads(task.data))
    return grade_log(spec, await run_eval_script(session, spec, timeout_s))


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


def _spec_problem(instance: dict[str, Any]) -> str | None:
    """Why the harness could not grade `instance` (None: it can)."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT, EvalType
    from swebench.harness.log_parsers import PARSER_REGISTRY

    if instance["log_parser"] not in PARSER_REGISTRY:
        return (f"log_parser {instance['log_parser']!r} is not one of swebench's parsers "
                f"({', '.join(sorted(PARSER_REGISTRY)[:3])}, ...); skipped")
    if instance["eval_type"] not in {e.value for e in EvalType}:
        return f"eval_type {instance['eval_type']!r}: use one of {[e.value for e in EvalType]}; skipped"
    script = str(instance["eval_script"])
    if START_TEST_OUTPUT not in script or END_TEST_OUTPUT not in script:
        return "eval_script lacks the harness's start/end test output markers; skipped"
    return None


@BENCHMARKS.register("swe-bench-verified", origin=_ORIGIN)
class SweBenchVerified:
    """SWE-bench Verified: 500 GitHub issues; resolved rate, graded by the `swebench` harness."""

    name = "swe-bench-verified"
    metric = "resolved rate (swebench get_eval_report)"
    layout = "instances JSONL/Parquet of the swebench 5.x release (eval_script, log_parser, ...) + images"
    task_type = "swe-bench-verified"
    scaffold = "terminal"
    reward = "verifier"
    verifier = "swebench"

    def load(self, path: Path) -> LoadedSuite:
        files = data_files(path)
        if not files:
            return LoadedSuite([], [f"{path}: no instances file (.jsonl, .json or .parquet)"])
        try:
            _harness()
        except SweBenchMissing as exc:
            return LoadedSuite([], [f"{path}: {exc}"])
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
        no_spec = [f for f in SPEC_FIELDS if row.get(f) in (None, "")]
        if no_spec:
            return (f"no test spec {no_spec}: swebench 5.x grades the dataset release that carries "
                    f"{list(SPEC_FIELDS)}; download that release; skipped")
        f2p, p2p = _test_list(row["FAIL_TO_PASS"]), _test_list(row["PASS_TO_PASS"])
        if f2p is None or p2p is None:
            field = "FAIL_TO_PASS" if f2p is None else "PASS_TO_PASS"
            return f"{field} is not a list of test ids (nor a JSON-encoded one); skipped"
        instance = {f: row[f] for f in (*REQUIRED, *SPEC_FIELDS) if f != "problem_statement"}
        instance.update(FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p, instance_id=str(row["instance_id"]))
        problem = _spec_problem(instance)
        if problem:
            return problem
        return TaskSample(
            task_id=instance["instance_id"],
            task_type=self.task_type,
            prompt=f"Resolve this issue in the repository at {REPO_DIR}:\n\n{row['problem_statement']}",
            data=json.dumps(instance),
            image=str(row["image"]),
            metadata={"suite": self.name, "repo": str(row["repo"]), "version": str(row["version"])},
        )

    def prepare(self, path: Path) -> list[str]:
        return self.load(path).readiness(
            f"{path}: holds no instances; point --from at SWE-bench Verified's instances file")

    def score(self, outcomes: Sequence[TaskOutcome], *, k: int) -> SuiteScore:
        return rate_score(outcomes, metric="resolved rate", k=k)
