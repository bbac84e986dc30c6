"""`stacx tasks check` over an in-memory backend: the oracle runs like Harbor's OracleAgent (solve.sh
run directly, non-interactive, a failing exit recorded and verified anyway); the network hint only
when the tests did not get to run; time limits named; ANSI codes kept out of error text; the
base-image map of `--base-image`."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from stacx.infra.commands import sandbox as commands
from stacx.sandbox.backends.fake import FakeBackend, FakeSandbox
from stacx.sandbox.checks import check_task
from stacx.sandbox.errors import ImageBuildError, RewardFileMissing
from stacx.sandbox.images import STAND_IN_PYTHON, TaskImageBuilder, map_base_image
from stacx.sandbox.models import ExecRequest, ExecResult, SessionSpec
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.tasks import load_task
from stacx.sandbox.terminal import clean_text
from stacx.sandbox.testing import FakeTaskImages

TASK = Path(__file__).resolve().parents[3] / "examples" / "tasks" / "write-file"
NETWORK_LINE = "curl: (6) Could not resolve host: astral.sh"


class _Task:
    """Fake sandbox: solve.sh writes the greeting then exits `solve_exit`; test.sh rewards it."""

    def __init__(self, *, solve_exit: int = 0, test_output: str = "", test_timed_out: bool = False) -> None:
        self.solve_exit = solve_exit
        self.test_output = test_output
        self.test_timed_out = test_timed_out
        self.oracle_runs: list[ExecRequest] = []

    def __call__(self, sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
        if "/solution/solve.sh" in request.command and not request.command.startswith("rm "):
            self.oracle_runs.append(request)
            sandbox.files["/app/greeting.txt"] = b"Hello, STACX!\n"
            return ExecResult(exit_code=self.solve_exit, stdout="done\n", stderr="", duration_s=0.01)
        if request.command.endswith("bash /tests/test.sh"):
            if self.test_timed_out:
                return ExecResult(exit_code=137, stdout="", stderr="", duration_s=30.0, timed_out=True)
            solved = sandbox.files.get("/app/greeting.txt") == b"Hello, STACX!\n"
            sandbox.files["/logs/verifier/reward.txt"] = b"1" if solved else b"0"
            return ExecResult(exit_code=0, stdout=self.test_output, stderr="", duration_s=0.01)
        if request.command.startswith("rm -rf /tests/*"):
            for path in [p for p in sandbox.files if p.startswith("/logs/verifier/")]:
                del sandbox.files[path]
        return ExecResult(exit_code=0, stdout="", stderr="", duration_s=0.01)


async def _check(script: _Task):  # type: ignore[no-untyped-def]
    backend = FakeBackend(script)
    images: Any = FakeTaskImages()
    async with SessionManager(SessionManager.Config(owner="t"), backend, images=images) as manager:
        return await check_task(manager, load_task(TASK))


async def test_oracle_runs_solve_sh_itself_with_debian_frontend_noninteractive() -> None:
    script = _Task()
    check = await _check(script)
    assert check.passed, check
    (run,) = script.oracle_runs
    assert run.command == "chmod +x /solution/solve.sh && /solution/solve.sh"  # its shebang decides
    assert run.env["DEBIAN_FRONTEND"] == "noninteractive"


async def test_a_failing_solve_sh_is_recorded_and_the_task_verified_anyway() -> None:
    check = await _check(_Task(solve_exit=3))
    assert check.error is None, check.error
    assert (check.oracle_reward, check.noop_reward, check.passed) == (1.0, 0.0, True)
    assert check.oracle_exit_codes == {"stacx-write-file": 3}  # a single step is named after the task
    assert any("solve.sh of stacx-write-file exited 3, verified anyway" in w for w in check.warnings)


async def test_network_hint_stays_quiet_when_the_tests_ran_and_failed_on_assertions() -> None:
    output = (
        f"{NETWORK_LINE}\ncollected 1 item\n\n"
        "    def test_x():\n>       assert 2 == 3\nE       assert 2 == 3\n"
        "FAILED tests/test_x.py::test_x - assert 2 == 3\n"
    )
    check = await _check_failing_oracle(_Task(test_output=output))
    assert check.oracle_reward == 0.0 and check.output_tail is not None
    assert check.needs_network is None, check.needs_network


async def _check_failing_oracle(script: _Task):  # type: ignore[no-untyped-def]
    def never_solved(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
        result = script(sandbox, request)
        sandbox.files.pop("/app/greeting.txt", None)
        if request.command.endswith("bash /tests/test.sh") and not script.test_timed_out:
            sandbox.files["/logs/verifier/reward.txt"] = b"0"
        return result

    backend = FakeBackend(never_solved)
    images: Any = FakeTaskImages()
    async with SessionManager(SessionManager.Config(owner="t"), backend, images=images) as manager:
        return await check_task(manager, load_task(TASK))


async def test_network_hint_fires_when_the_tests_never_ran_for_want_of_network() -> None:
    check = await _check_failing_oracle(_Task(test_output=f"{NETWORK_LINE}\nerror: pytest not found\n"))
    assert check.oracle_reward == 0.0
    assert check.needs_network is not None and NETWORK_LINE in check.needs_network


async def test_a_verifier_timeout_names_the_limit_and_where_it_is_set() -> None:
    check = await _check(_Task(test_timed_out=True))
    assert check.error is not None
    assert "test.sh timed out ([verifier] timeout_sec = 30 s of " in check.error
    assert str(TASK / "task.toml") in check.error


async def test_a_timed_out_solve_sh_names_the_agent_limit() -> None:
    def slow(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
        if request.command == "chmod +x /solution/solve.sh && /solution/solve.sh":
            return ExecResult(exit_code=137, stdout="", stderr="", duration_s=120.0, timed_out=True)
        return _Task()(sandbox, request)

    backend = FakeBackend(slow)
    images: Any = FakeTaskImages()
    async with SessionManager(SessionManager.Config(owner="t"), backend, images=images) as manager:
        check = await check_task(manager, load_task(TASK))
    assert any("timed out ([agent] timeout_sec = 120 s of " in w for w in check.warnings), check.warnings


async def test_verify_raises_missing_reward_with_the_limit() -> None:
    backend = FakeBackend(_Task(test_timed_out=True))
    async with SessionManager(SessionManager.Config(owner="t"), backend) as manager:
        session = await manager.create(SessionSpec())
        with pytest.raises(RewardFileMissing, match=r"timed out \(\[verifier\] timeout_sec = 30 s of "):
            await manager.verify(session.id, TASK)


def test_clean_text_drops_ansi_codes_and_progress_redraws() -> None:
    text = "\x1b[1;31mERROR\x1b[0m: no\r\n\x1b]0;title\x07 10%\r 50%\r100% done\n\x1b[2K\x1b[1Gok"
    assert clean_text(text) == "ERROR: no\n100% done\nok"


class _BuildClient:
    """Docker SDK stand-in whose builds stream coloured output and fail."""

    def __init__(self) -> None:
        self.api = self
        self.images = self

    def get(self, name: str) -> Any:
        raise docker.errors.ImageNotFound(name)

    def build(self, **_: Any) -> Any:
        yield {"stream": "\x1b[91mStep 1/2 : RUN pip install x\x1b[0m\n"}
        yield {"stream": "\x1b[31mERROR: Could not install\x1b[0m\n"}
        yield {"error": "\x1b[31mThe command returned a non-zero code: 1\x1b[0m"}


def test_build_errors_carry_no_ansi_codes(tmp_path: Path) -> None:
    builder = TaskImageBuilder(TaskImageBuilder.Config(base_images={}), client=_BuildClient())
    task = load_task(TASK)
    with pytest.raises(ImageBuildError) as caught:
        builder._stream_build(task, "t:1", task.dockerfile)  # the build step alone, FROM left as is
    assert "\x1b" not in str(caught.value)
    assert "The command returned a non-zero code: 1" in str(caught.value)
    assert "ERROR: Could not install" in str(caught.value)


def test_a_base_image_pattern_replaces_the_default_entry() -> None:
    mapping = commands._base_images(["python:*=my/python:3.13"])
    assert map_base_image("python:3.12-slim", mapping) == "my/python:3.13"
    assert map_base_image("python", mapping) == STAND_IN_PYTHON  # the bare name keeps its default
    first = commands._base_images(["python:3.12*=a:1", "python:*=b:1"])
    assert map_base_image("python:3.12", first) == "a:1"  # the first match wins, in the order given
    assert map_base_image("python:3.11", first) == "b:1"


def test_a_pattern_as_the_local_image_is_refused() -> None:
    with pytest.raises(ValueError, match="LOCAL must be one image, not a pattern"):
        commands._base_images(["python:*=my/python:*"])


UV_NO_PYTHON = (
    "error: No interpreter found for Python 3.13 in managed installations or search path\n\n"
    "hint: A managed Python download is available for Python 3.13, but Python downloads are set to 'never'\n"
)
"""What uv 0.13.9 prints for `uvx -p 3.13` with downloads off and no 3.13 about."""


def _uvx_task(tmp_path: Path) -> Path:
    root = tmp_path / "uvx-task"
    shutil.copytree(TASK, root)
    (root / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p logs\ncurl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh\n"
        "source $HOME/.local/bin/env\n"
        "uvx -p 3.13 --with pytest==8.4.1 pytest /tests/test_outputs.py -rA\n"
        "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt\n"
        "else echo 0 > /logs/verifier/reward.txt; fi\n"
    )
    return root


async def test_a_missing_python_is_one_line_naming_the_version_asked_and_how_to_provide_it(
    tmp_path: Path,
) -> None:
    def no_python(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
        if request.command.endswith("bash /tests/test.sh"):
            sandbox.files["/logs/verifier/reward.txt"] = b"0"
            return ExecResult(
                exit_code=0, stdout="", stderr=NETWORK_LINE + "\n" + UV_NO_PYTHON, duration_s=0.1
            )
        return _Task()(sandbox, request)

    backend = FakeBackend(no_python)
    images: Any = FakeTaskImages()
    async with SessionManager(SessionManager.Config(owner="t"), backend, images=images) as manager:
        check = await check_task(manager, load_task(_uvx_task(tmp_path)))
    assert check.oracle_reward == 0.0
    hint = check.needs_python or ""
    assert "asks for Python 3.13 (`uvx -p 3.13 --with pytest==8.4.1" in hint, hint
    assert "--python-dir DIR" in hint and "uv python install --install-dir DIR 3.13" in hint
    assert "\n" not in hint
    assert check.needs_network is None  # the stubbed installer's curl is not why it failed
    assert "asks for Python 3.13" in commands._describe(check)


async def test_a_python_dir_reaches_task_sessions_and_their_verifier() -> None:
    seen: list[ExecRequest] = []

    def record(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
        seen.append(request)
        return _Task()(sandbox, request)

    backend = FakeBackend(record)
    images: Any = FakeTaskImages(python_volume="python-vol")
    async with SessionManager(SessionManager.Config(owner="t"), backend, images=images) as manager:
        session = await manager.create(SessionSpec(task_dir=str(TASK)))
        (sandbox,) = backend.sandboxes.values()
        assert sandbox.spec.volumes == {"tools-vol": "/opt/stacx-tools", "python-vol": "/opt/stacx-python"}
        await manager.verify(session.id, TASK)
    (run,) = [r for r in seen if r.command.endswith("bash /tests/test.sh")]
    assert "export UV_PYTHON_INSTALL_DIR=/opt/stacx-python" in run.command
    assert 'for _bin in /opt/stacx-python/*/bin; do [ -d "$_bin" ] && PATH="$PATH:$_bin"; done' in run.command
