"""SWE-bench Verified graded by the harness: our verifier against `swebench`'s own
`get_eval_report` on the same eval-script runs (every case of swebench_logs.py: django, sympy,
pytest, astropy, requests, matplotlib, ... formats), and the suite's reading of instance rows."""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from swebench.harness.grading import compute_fail_to_pass, compute_pass_to_pass, get_eval_report
from swebench.harness.utils import make_test_spec
from swebench_logs import CASES, LogCase

from stacx.infra.benchmarks import build_suite
from stacx.infra.benchmarks import swebench as adapter
from stacx.infra.benchmarks.swebench import swebench_verifier
from stacx.infra.commands.bench import _evaluators
from stacx.rollout.protocols import ExecResult
from stacx.schemas.records import TaskSample

SAMPLES = Path(__file__).resolve().parents[2] / "benchmark_samples" / "swe-bench-verified"
LOCAL = SAMPLES.parent / "swe-bench-verified-local"
REAL_LOGS = sorted((LOCAL / "logs").glob("*.log"))
"""Eval-script runs of real instances in their images built here (gold and empty patch)."""


@dataclass
class LocalSession:
    """A sandbox session fake that runs each command with bash on this machine, in `root`
    (the verifier's /tmp files land there); commands are recorded."""

    root: Path
    session_id: str = "local"
    commands: list[str] = field(default_factory=list)

    async def exec(
        self, command: str, *, stdin: str | None = None, timeout_s: float | None = None
    ) -> ExecResult:
        self.commands.append(command)
        local = command.replace("/tmp/stacx-swebench-", f"{self.root}/stacx-swebench-")
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", local, cwd=self.root, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
        return ExecResult(exit_code=proc.returncode or 0, stdout=out.decode(), stderr=err.decode())

    async def verify(self) -> dict[str, float]:
        raise AssertionError("the swebench verifier runs its own eval script")

    async def close(self) -> None:
        return None


def _eval_script(case: LogCase, body: Path) -> str:
    """An eval script shaped as the harness's (bash -x trace, `: marker` lines, the reset after),
    whose test command prints `case.output` and exits with `case.exit_code`."""
    test_command = f"cat {shlex.quote(str(body))}; (exit {case.exit_code})"
    lines = ["#!/bin/bash", "set -uxo pipefail", "cd /", "git --version >/dev/null"]
    if not case.markers:
        return "\n".join([*lines, "echo 'error: patch failed: tests/test_x.py:1'", "exit 1"]) + "\n"
    return "\n".join([*lines, ": '>>>>> Start Test Output'", test_command, ": '>>>>> End Test Output'",
                      "true  # git checkout <base> <test files>"]) + "\n"


def _instance(case: LogCase, script: str) -> dict[str, object]:
    return {"instance_id": "x__x-1", "repo": case.repo, "version": "1.0", "base_commit": "0" * 40,
            "test_patch": "", "image": "img", "FAIL_TO_PASS": case.fail_to_pass,
            "PASS_TO_PASS": case.pass_to_pass, "eval_script": script, "log_parser": case.log_parser,
            "eval_type": "pass_and_fail"}


def _harness_verdict(instance: dict[str, object], tmp: Path) -> dict[str, float]:
    """What `swebench.harness.run_evaluation` does: `/bin/bash /eval.sh` with both streams in
    one log, written to test_output.txt, graded by `get_eval_report`."""
    spec = make_test_spec(instance)
    (tmp / "eval.sh").write_text(spec.eval_script)
    run = subprocess.run(["/bin/bash", str(tmp / "eval.sh")], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, check=False)
    (tmp / "test_output.txt").write_bytes(run.stdout)
    prediction = {"instance_id": "x__x-1", "model_patch": "", "model_name_or_path": "gold"}
    report = get_eval_report(spec, prediction, str(tmp / "test_output.txt"), True)["x__x-1"]
    tests = report.get("tests_status")
    return {"reward": float(report["resolved"]),
            "fail_to_pass": float(compute_fail_to_pass(tests)) if tests else 0.0,
            "pass_to_pass": float(compute_pass_to_pass(tests)) if tests else 0.0,
            "tests_ran": float(report["patch_successfully_applied"])}


def test_the_cases_cover_every_format_the_issue_lists() -> None:
    assert len(CASES) >= 40 and len(REAL_LOGS) == 10
    parsers = {c.log_parser for c in CASES}
    assert {"parse_log_django", "parse_log_sympy", "parse_log_pytest", "parse_log_astropy",
            "parse_log_requests", "parse_log_matplotlib", "parse_log_pylint"} <= parsers
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_our_verdict_is_the_harness_verdict(case: LogCase, tmp_path: Path) -> None:
    body = tmp_path / "body.txt"
    body.write_text(case.output)
    instance = _instance(case, _eval_script(case, body))
    (tmp_path / "harness").mkdir()
    theirs = _harness_verdict(instance, tmp_path / "harness")
    task = TaskSample(task_id="x__x-1", task_type="swe-bench-verified", prompt="",
                      data=json.dumps(instance), image="img")
    ours = await swebench_verifier(LocalSession(tmp_path), task)
    assert ours == theirs
    assert ours["reward"] == float(case.resolved), "the verdict worked out by hand"


@pytest.mark.parametrize("log", REAL_LOGS, ids=[p.stem for p in REAL_LOGS])
async def test_real_runs_get_the_harness_verdict(log: Path, tmp_path: Path) -> None:
    instance_id, patch = log.stem.split(".")
    row = next(r for r in json.loads((LOCAL / "test.json").read_text()) if r["instance_id"] == instance_id)
    prediction = {"instance_id": instance_id, "model_patch": "", "model_name_or_path": "gold"}
    theirs = get_eval_report(make_test_spec(row), prediction, str(log), True)[instance_id]
    replay = {**row, "eval_script": f"cat {log}"}  # the eval script replays the real run's output
    task = TaskSample(task_id=instance_id, task_type="t", prompt="", data=json.dumps(replay), image="i")
    ours = await swebench_verifier(LocalSession(tmp_path), task)
    assert ours["reward"] == float(theirs["resolved"]) == float(patch == "gold")
    tests = theirs["tests_status"]
    assert ours["fail_to_pass"] == compute_fail_to_pass(tests) == float(patch == "gold")
    assert ours["pass_to_pass"] == compute_pass_to_pass(tests) == 1.0


async def test_the_whole_log_comes_back_past_the_sandbox_output_cap(tmp_path: Path) -> None:
    """A django run prints more than one exec returns; the passing line is at the very end."""
    noise = "".join(f"test_{i} (validators.tests.TestValidators.test_{i}) ... ok\n" for i in range(40000))
    case = next(c for c in CASES if c.name == "django all pass")
    body = tmp_path / "body.txt"
    body.write_text(noise + case.output)
    instance = _instance(case, _eval_script(case, body))
    assert body.stat().st_size > 2 * adapter._CHUNK
    task = TaskSample(task_id="x__x-1", task_type="t", prompt="", data=json.dumps(instance), image="i")
    session = LocalSession(tmp_path)
    assert (await swebench_verifier(session, task))["reward"] == 1.0
    assert sum("base64" in c for c in session.commands) >= 3


async def test_a_timed_out_run_is_not_resolved(tmp_path: Path) -> None:
    case = next(c for c in CASES if c.name == "pytest all pass")
    body = tmp_path / "body.txt"
    body.write_text(case.output)
    instance = _instance(case, _eval_script(case, body))
    spec = make_test_spec(instance)

    class Slow(LocalSession):
        async def exec(self, command: str, *, stdin: str | None = None,
                       timeout_s: float | None = None) -> ExecResult:
            result = await super().exec(command, stdin=stdin, timeout_s=timeout_s)
            return ExecResult(exit_code=137, timed_out=True) if "/bin/bash" in command else result

    log = await adapter.run_eval_script(Slow(tmp_path), spec, timeout_s=5)
    assert ">>>>> Tests Timed Out" in log
    assert adapter.grade_log(spec, log)["reward"] == 0.0
    assert adapter.grade_log(spec, log.split(">>>>> Tests Timed Out")[0])["reward"] == 1.0


def test_rows_become_tasks_with_the_harness_test_spec() -> None:
    loaded = build_suite("swe-bench-verified").load(SAMPLES)
    django, sympy, requests = loaded.tasks
    spec = make_test_spec(json.loads(django.data))
    runtests = "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 validators.tests"
    assert runtests in spec.eval_script
    assert "invalid_urls" not in spec.eval_script.split(": '>>>>> Start Test Output'")[1].splitlines()[1]
    assert spec.log_parser == "parse_log_django" and spec.FAIL_TO_PASS == [
        "test_new (validators.tests.TestValidators.test_new)"]
    assert django.image == "swebench/sweb.eval.x86_64.django_1776_django-90001:latest"
    sympy_spec = make_test_spec(json.loads(sympy.data))
    assert "bin/test -C --verbose sympy/core/tests/test_numbers.py" in sympy_spec.eval_script
    assert sympy_spec.log_parser == "parse_log_sympy" and sympy_spec.FAIL_TO_PASS == ["test_round"]
    assert "conda activate testbed" in sympy_spec.eval_script
    assert json.loads(requests.data)["log_parser"] == "parse_log_requests"
    assert "Rational rounds wrongly." in sympy.prompt


def test_rows_the_harness_cannot_grade_are_skipped_with_one_line_each() -> None:
    problems = build_suite("swe-bench-verified").prepare(SAMPLES)
    assert [p.split("test.jsonl:")[1].split(":")[0] for p in problems] == ["4", "5", "6", "7"]
    assert problems[0].endswith("missing field(s) ['base_commit', 'test_patch', 'FAIL_TO_PASS', "
                                "'PASS_TO_PASS']; an instance has ['instance_id', 'repo', 'base_commit', "
                                "'problem_statement', 'test_patch', 'FAIL_TO_PASS', 'PASS_TO_PASS']; skipped")
    assert problems[1].endswith("FAIL_TO_PASS is not a list of test ids (nor a JSON-encoded one); skipped")
    assert problems[2].endswith("no test spec ['image', 'eval_script', 'log_parser', 'eval_type']: swebench "
                                "5.x grades the dataset release that carries ['version', 'image', "
                                "'eval_script', 'log_parser', 'eval_type']; download that release; skipped")
    assert "log_parser 'parse_log_nose' is not one of swebench's parsers" in problems[3]


def test_a_config_may_name_its_own_verifier_for_the_suite() -> None:
    suite = build_suite("swe-bench-verified")
    own = {"swe-bench-verified": {"scaffold": "terminal", "verifier": "my_pkg.grading:verify"}}
    chosen = _evaluators(own, suite, None, 2, suite.reward)["swe-bench-verified"]
    assert chosen["verifier"] == "my_pkg.grading:verify"
    default = {"default": {"scaffold": "terminal", "verifier": "harbor"}}
    assert _evaluators(default, suite, None, 2, suite.reward)["swe-bench-verified"]["verifier"] == "swebench"
