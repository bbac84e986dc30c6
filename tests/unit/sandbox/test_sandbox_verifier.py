"""Reward files and the verifier flow, over an in-memory backend."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from stacx.sandbox.backends.fake import FakeBackend, FakeSandbox
from stacx.sandbox.errors import (
    RewardFileEmpty,
    RewardFileMalformed,
    RewardFileMissing,
    SandboxFileNotFound,
    TaskFormatError,
)
from stacx.sandbox.models import ExecRequest, ExecResult, SessionSpec
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.tasks import load_task
from stacx.sandbox.verifier import (
    parse_reward_json,
    parse_reward_text,
    run_oracle,
    scalar_reward,
    timeout_source,
    verify,
)

TASK = Path(__file__).resolve().parents[3] / "examples" / "tasks" / "write-file"


def test_reward_text() -> None:
    assert parse_reward_text(b"1\n") == 1.0
    assert parse_reward_text(b" 0.25 ") == 0.25
    with pytest.raises(RewardFileEmpty):
        parse_reward_text(b"  \n")
    with pytest.raises(RewardFileMalformed, match="one number"):
        parse_reward_text(b"passed")
    with pytest.raises(RewardFileMalformed, match="finite"):
        parse_reward_text(b"nan")


def test_reward_json() -> None:
    assert parse_reward_json(b'{"reward": 1, "style": 0.5}') == {"reward": 1.0, "style": 0.5}
    with pytest.raises(RewardFileEmpty):
        parse_reward_json(b"")
    with pytest.raises(RewardFileMalformed, match="not valid JSON"):
        parse_reward_json(b"{reward: 1")
    with pytest.raises(RewardFileMalformed, match="object"):
        parse_reward_json(b"[1]")
    with pytest.raises(RewardFileMalformed, match="not numbers"):
        parse_reward_json(b'{"reward": "high", "ok": true}')
    for text in (b'{"reward": NaN}', b'{"reward": 1, "style": Infinity}', b'{"reward": 1e999}'):
        with pytest.raises(RewardFileMalformed, match="must be finite numbers"):
            parse_reward_json(text)


def test_scalar_reward_prefers_reward_key_then_mean() -> None:
    assert scalar_reward({"reward": 0.2, "x": 1.0}) == 0.2
    assert scalar_reward({"a": 1.0, "b": 0.0}) == 0.5


def _writes(files: dict[str, bytes]):  # type: ignore[no-untyped-def]
    def handler(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
        if request.command.endswith("bash /tests/test.sh"):
            sandbox.files.update(files)
        return ExecResult(exit_code=0, stdout="", stderr="", duration_s=0.01)

    return handler


async def _verify(files: dict[str, bytes]) -> float:
    backend = FakeBackend(_writes(files))
    async with SessionManager(SessionManager.Config(owner="t"), backend) as manager:
        session = await manager.create(SessionSpec())
        result = await manager.verify(session.id, TASK)
        assert backend.sandboxes[f"fake-{session.id}"].files["/tests/test.sh"].startswith(b"#!/bin/bash")
        return result.reward


async def test_verify_reads_reward_txt() -> None:
    assert await _verify({"/logs/verifier/reward.txt": b"1\n"}) == 1.0


async def test_reward_json_wins_over_txt() -> None:
    files = {"/logs/verifier/reward.json": b'{"a": 1, "b": 0}', "/logs/verifier/reward.txt": b"1"}
    assert await _verify(files) == 0.5


@pytest.mark.parametrize(
    ("files", "error"),
    [
        ({}, RewardFileMissing),
        ({"/logs/verifier/reward.txt": b""}, RewardFileEmpty),
        ({"/logs/verifier/reward.txt": b"ok"}, RewardFileMalformed),
        ({"/logs/verifier/reward.json": b"{"}, RewardFileMalformed),
    ],
)
async def test_bad_reward_files_are_distinct_errors(files: dict[str, bytes], error: type) -> None:
    with pytest.raises(error):
        await _verify(files)


async def test_oracle_uploads_and_runs_solve_sh() -> None:
    backend = FakeBackend()
    async with SessionManager(SessionManager.Config(owner="t"), backend) as manager:
        session = await manager.create(SessionSpec())
        result = await run_oracle(manager, session.id, load_task(TASK))
        sandbox = backend.sandboxes[f"fake-{session.id}"]
        assert result.ok
        assert sandbox.commands[-1] == "chmod +x /solution/solve.sh && /solution/solve.sh"  # at /solution
        assert b"Hello, STACX!" in sandbox.files["/solution/solve.sh"]


class _Ops:
    """Records the session operations the oracle makes."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def exec(
        self,
        session_id: str,
        command: str,
        *,
        timeout_s: float = 60.0,
        stdin: str | None = None,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecResult:
        self.calls.append(("exec", session_id, command, timeout_s, env))
        return ExecResult(exit_code=3, stdout="solved", stderr="", duration_s=0.1)

    async def upload_archive(self, session_id: str, dest: str, data: bytes) -> None:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            self.calls.append(("upload", session_id, dest, sorted(tar.getnames())))

    async def download(self, session_id: str, path: str) -> bytes:
        raise AssertionError("the oracle reads nothing back")


def _task_copy(tmp_path: Path, extra_toml: str = "") -> Path:
    task = tmp_path / "task"
    shutil.copytree(TASK, task)
    if extra_toml:
        with (task / "task.toml").open("a") as f:
            f.write(extra_toml)
    return task


async def test_the_oracle_clears_uploads_and_runs_solve_sh_with_the_agent_timeout(tmp_path: Path) -> None:
    task = load_task(_task_copy(tmp_path, '\n[solution.env]\nGREETING = "hi"\n'))
    ops = _Ops()
    result = await run_oracle(ops, "s1", task)
    assert result.exit_code == 3 and result.stdout == "solved"  # the caller records the status
    assert ops.calls == [
        ("exec", "s1", "rm -rf /solution/* && mkdir -p /solution", 60, None),
        ("upload", "s1", "/solution", ["solve.sh"]),
        (
            "exec",
            "s1",
            "chmod +x /solution/solve.sh && /solution/solve.sh",
            120.0,  # [agent] timeout_sec
            {"DEBIAN_FRONTEND": "noninteractive", "GREETING": "hi"},
        ),
    ]


async def test_a_task_without_a_solution_is_refused_before_any_call(tmp_path: Path) -> None:
    path = _task_copy(tmp_path)
    shutil.rmtree(path / "solution")
    ops = _Ops()
    with pytest.raises(FileNotFoundError, match=r"solution/solve.sh does not exist"):
        await run_oracle(ops, "s1", load_task(path))
    assert ops.calls == []


def test_reward_files_that_are_not_utf8_are_malformed_not_a_crash() -> None:
    with pytest.raises(RewardFileMalformed, match="one number"):
        parse_reward_text(b"\xff\xfe1")
    with pytest.raises(RewardFileMalformed, match="not valid JSON"):
        parse_reward_json(b'{"reward": \xff}')


def test_a_malformed_reward_file_is_quoted_to_80_characters_with_the_expected_shape() -> None:
    with pytest.raises(RewardFileMalformed) as text_error:
        parse_reward_text(b"x" * 200)
    assert str(text_error.value).endswith(repr("x" * 80))
    with pytest.raises(RewardFileMalformed) as json_error:
        parse_reward_json(b"[" + b"1, " * 100 + b"1]")
    assert repr(("[" + "1, " * 100)[:80]) in str(json_error.value)
    hint = r'finite numbers, got .*; test.sh must write numbers such as \{"reward": 0.5\}$'
    with pytest.raises(RewardFileMalformed, match=hint):
        parse_reward_json(b'{"reward": Infinity}')


class _VerifyOps(_Ops):
    """Records the verifier's session operations; test.sh ends as `run` says, leaving `files`."""

    def __init__(self, run: ExecResult, files: dict[str, bytes]) -> None:
        super().__init__()
        self.run, self.files = run, files

    async def exec(self, session_id: str, command: str, **kwargs: Any) -> ExecResult:
        first_line = command.splitlines()[0]
        self.calls.append(("exec", session_id, first_line, kwargs.get("timeout_s"), kwargs.get("env")))
        if command.endswith("bash /tests/test.sh"):
            return self.run
        return ExecResult(exit_code=0, stdout="", stderr="", duration_s=0.0)

    async def download(self, session_id: str, path: str) -> bytes:
        if path not in self.files:
            raise SandboxFileNotFound(path)
        return self.files[path]


async def test_verify_resets_uploads_and_runs_test_sh_with_its_timeout_and_env(tmp_path: Path) -> None:
    task = load_task(_task_copy(tmp_path, '\n[verifier.env]\nMODE = "strict"\n'))
    run = ExecResult(exit_code=0, stdout="out", stderr="err", duration_s=1.5, timed_out=False)
    ops = _VerifyOps(run, {"/logs/verifier/reward.txt": b"0.25"})
    result = await verify(ops, "s1", task)
    assert ops.calls == [
        ("exec", "s1", "rm -rf /tests/* /logs/verifier && mkdir -p /tests /logs/verifier /logs/agent "
         "/logs/artifacts && chmod 777 /logs/verifier", 60, None),
        ("upload", "s1", "/tests", ["test.sh"]),
        ("exec", "s1", "if [ -x /opt/stacx-tools/bin/uv ]; then", 60, None),
        ("exec", "s1", "if [ -d /opt/stacx-tools/bin ]; then", 30.0, {"MODE": "strict"}),
    ]  # fmt: skip
    assert result.rewards == {"reward": 0.25} and result.reward == 0.25
    assert (result.exit_code, result.stdout, result.stderr, result.duration_s) == (0, "out", "err", 1.5)
    assert result.timed_out is False and result.step is None  # one step: not named


@pytest.mark.parametrize(
    ("run", "state"),
    [
        (ExecResult(exit_code=3, stdout="a" * 700, stderr="Z", duration_s=1.0), "exited 3"),
        (
            ExecResult(exit_code=-1, stdout="a" * 700, stderr="Z", duration_s=30.0, timed_out=True),
            "timed out ([verifier] timeout_sec = 30 s of {path}/task.toml)",
        ),
    ],
)
async def test_no_reward_file_names_how_test_sh_ended_and_its_last_output(
    tmp_path: Path, run: ExecResult, state: str
) -> None:
    path = _task_copy(tmp_path)
    ops = _VerifyOps(run, {})
    with pytest.raises(RewardFileMissing) as error:
        await verify(ops, "s1", load_task(path))
    assert str(error.value) == (
        f"test.sh {state.format(path=path)} and wrote neither /logs/verifier/reward.json nor "
        f"/logs/verifier/reward.txt; output: {'a' * 599 + 'Z'!r}"
    )


def test_timeout_source_names_the_section_and_the_file(tmp_path: Path) -> None:
    path = _task_copy(tmp_path)
    task = load_task(path)
    step = task.steps[0]
    assert timeout_source("agent", task, step) == f"[agent] timeout_sec = 120 s of {path}/task.toml"
    assert timeout_source("verifier", task, step) == f"[verifier] timeout_sec = 30 s of {path}/task.toml"


def _two_step_task(tmp_path: Path) -> Path:
    """A copy of the example task made into two steps: `first` keeps the task's limits, `second`
    sets its own agent and verifier limits; each step has its own test.sh and solve.sh."""
    task = _task_copy(tmp_path)
    toml = (task / "task.toml").read_text()
    toml += '\n[[steps]]\nname = "first"\n\n[[steps]]\nname = "second"\n'
    toml += "agent = { timeout_sec = 45.0 }\nverifier = { timeout_sec = 12.0 }\n"
    (task / "task.toml").write_text(toml)
    shutil.rmtree(task / "tests")
    shutil.rmtree(task / "solution")
    for name in ("first", "second"):
        step = task / "steps" / name
        (step / "tests").mkdir(parents=True)
        (step / "solution").mkdir()
        (step / "instruction.md").write_text(f"do {name}\n")
        (step / "tests" / f"test_{name}.sh").write_text("true\n")
        (step / "tests" / "test.sh").write_text(f"echo 1 > /logs/verifier/reward.txt # {name}\n")
        (step / "solution" / "solve.sh").write_text(f"echo {name}\n")
    return task


async def test_verify_runs_the_last_step_by_default_and_names_it(tmp_path: Path) -> None:
    task = load_task(_two_step_task(tmp_path))
    run = ExecResult(exit_code=0, stdout="", stderr="", duration_s=1.0, timed_out=True)
    ops = _VerifyOps(run, {"/logs/verifier/reward.txt": b"1"})
    result = await verify(ops, "s1", task)
    assert result.step == "second" and result.timed_out is True  # a reward despite the time-out
    uploads = [c for c in ops.calls if c[0] == "upload"]
    assert uploads == [("upload", "s1", "/tests", ["test.sh", "test_second.sh"])]
    assert ops.calls[-1][3] == 12.0  # the step's own [verifier] timeout_sec
    first = await verify(_VerifyOps(run, {"/logs/verifier/reward.txt": b"1"}), "s1", task, task.steps[0])
    assert first.step == "first"


async def test_the_oracle_applies_the_first_step_by_default(tmp_path: Path) -> None:
    task = load_task(_two_step_task(tmp_path))
    ops = _Ops()
    await run_oracle(ops, "s1", task)
    assert ops.calls[1] == ("upload", "s1", "/solution", ["solve.sh"])
    assert ops.calls[-1][3] == 120.0  # `first` has no limit of its own: the task's [agent] one
    ops = _Ops()
    await run_oracle(ops, "s1", task, task.steps[1])
    assert ops.calls[-1][3] == 45.0


def test_timeout_source_names_the_step_that_sets_its_own_limit(tmp_path: Path) -> None:
    path = _two_step_task(tmp_path)
    task = load_task(path)
    first, second = task.steps
    assert timeout_source("agent", task, second) == "[agent] timeout_sec = 45 s of step second"
    assert timeout_source("verifier", task, second) == "[verifier] timeout_sec = 12 s of step second"
    assert timeout_source("agent", task, first) == f"[agent] timeout_sec = 120 s of {path}/task.toml"
    assert timeout_source("verifier", task, first) == f"[verifier] timeout_sec = 30 s of {path}/task.toml"


async def test_an_unset_host_variable_in_the_verifier_env_names_the_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STACX_UNIT_UNSET", raising=False)
    path = _task_copy(tmp_path, '\n[verifier.env]\nTOKEN = "${STACX_UNIT_UNSET}"\n')
    ops = _VerifyOps(ExecResult(exit_code=0, stdout="", stderr="", duration_s=0.0), {})
    message = f"^{path}/task.toml \\[verifier.env\\] needs \\$\\{{STACX_UNIT_UNSET\\}}, which is not set"
    with pytest.raises(TaskFormatError, match=message):
        await verify(ops, "s1", load_task(path))


async def test_an_unset_host_variable_in_the_solution_env_names_the_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STACX_UNIT_UNSET", raising=False)
    path = _task_copy(tmp_path, '\n[solution.env]\nTOKEN = "${STACX_UNIT_UNSET}"\n')
    message = f"^{path}/task.toml \\[solution.env\\] needs \\$\\{{STACX_UNIT_UNSET\\}}, which is not set"
    with pytest.raises(TaskFormatError, match=message):
        await run_oracle(_Ops(), "s1", load_task(path))


def test_an_infinite_reward_is_quoted_to_80_characters() -> None:
    text = "1" + "0" * 100 + "e999"  # a float() accepts, and infinite
    with pytest.raises(RewardFileMalformed) as error:
        parse_reward_text(text.encode(), where="reward.txt")
    assert str(error.value) == f"reward.txt must hold a finite number, got {text[:80]!r}"
