"""Reward files and the verifier flow, over an in-memory backend."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sandbox.backends.fake import FakeBackend, FakeSandbox
from sandbox.errors import RewardFileEmpty, RewardFileMalformed, RewardFileMissing
from sandbox.models import ExecRequest, ExecResult, SessionSpec
from sandbox.sessions import SessionManager
from sandbox.tasks import load_task
from sandbox.verifier import parse_reward_json, parse_reward_text, run_oracle, scalar_reward

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
