"""Harbor tasks on the real engine: every built-in task scores 1.0 with its oracle and 0.0 with
a no-op agent; missing base images and bad reward files fail with distinct, clear errors."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from stacx.sandbox.backends import DockerBackend
from stacx.sandbox.checks import check_task
from stacx.sandbox.client import SandboxClient
from stacx.sandbox.errors import BaseImageMissing, RewardFileEmpty, RewardFileMalformed, RewardFileMissing
from stacx.sandbox.images import TaskImageBuilder
from stacx.sandbox.models import SessionSpec
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.tasks import load_task
from stacx.sandbox.testing import serve_gateway

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "tasks"
BUILTIN = sorted(p.name for p in EXAMPLES.iterdir() if (p / "task.toml").is_file())


@pytest.fixture
async def manager(sandbox_image: str) -> AsyncIterator[SessionManager]:
    config = SessionManager.Config(owner=f"test-tasks-{uuid.uuid4().hex[:8]}", default_image=sandbox_image)
    backend = DockerBackend()
    async with SessionManager(config, backend, images=TaskImageBuilder()) as mgr:
        yield mgr
    await backend.close()


def test_there_are_at_least_six_builtin_tasks() -> None:
    assert len(BUILTIN) >= 6


@pytest.mark.parametrize("name", BUILTIN)
async def test_builtin_task_oracle_scores_1_noop_scores_0(manager: SessionManager, name: str) -> None:
    check = await check_task(manager, load_task(EXAMPLES / name))
    assert check.error is None
    assert (check.oracle_reward, check.noop_reward) == (1.0, 0.0)


async def test_the_oracle_runs_solve_sh_by_its_shebang_and_a_failing_exit_is_verified_anyway(
    manager: SessionManager, tmp_path: Path
) -> None:
    """Like Harbor's OracleAgent: solve.sh is run directly (here a Python script, which
    `bash solve.sh` cannot run), non-interactively, and its exit status is recorded, not fatal."""
    root = tmp_path / "python-oracle"
    shutil.copytree(EXAMPLES / "write-file", root)
    (root / "solution" / "solve.sh").write_text(
        "#!/usr/bin/env python3\nimport os, sys\n"
        "open('/app/greeting.txt', 'w').write('Hello, STACX!\\n')\n"
        "sys.exit(0 if os.environ.get('DEBIAN_FRONTEND') == 'noninteractive' else 5)\n"
    )
    check = await check_task(manager, load_task(root))
    assert check.error is None, check.error
    assert (check.oracle_reward, check.noop_reward, check.oracle_exit_codes) == (1.0, 0.0, {})
    (root / "solution" / "solve.sh").write_text(  # the same work, then exit 3
        (root / "solution" / "solve.sh").read_text().replace("sys.exit(0 if", "sys.exit(3 if")
    )
    failing = await check_task(manager, load_task(root))
    assert (failing.oracle_reward, failing.passed) == (1.0, True), failing
    assert failing.oracle_exit_codes == {"stacx-write-file": 3}


async def test_task_session_through_the_gateway(sandbox_image: str) -> None:
    config = SessionManager.Config(owner=f"test-tasks-{uuid.uuid4().hex[:8]}", default_image=sandbox_image)
    task_dir = str(EXAMPLES / "json-to-csv")
    with serve_gateway(DockerBackend(), token="t", config=config, images=TaskImageBuilder()) as url:
        async with SandboxClient(SandboxClient.Config(base_url=url, token="t")) as client:
            async with client.session(task_dir=task_dir) as info:
                assert info.workdir == "/app" and info.task_name == "stacx/json-to-csv"
                assert (await client.verify_remote(info.id)).reward == 0.0
                solved = await client.run_oracle(info.id, task_dir)
                assert solved.ok
                result = await client.verify(info.id, task_dir)
                assert result.reward == 1.0
                assert result.rewards == {"reward": 1.0, "header": 1.0, "rows": 1.0, "order": 1.0}


def _task(tmp_path: Path, test_sh: str, dockerfile: str = "FROM stacx/sandbox:bookworm\n") -> Path:
    root = tmp_path / "task"
    shutil.copytree(EXAMPLES / "write-file", root)
    (root / "environment" / "Dockerfile").write_text(dockerfile)
    (root / "tests" / "test.sh").write_text(test_sh)
    return root


async def test_missing_from_image_is_named(manager: SessionManager, tmp_path: Path) -> None:
    root = _task(tmp_path, "true\n", dockerfile="FROM stacx/not-built-anywhere:1\nRUN true\n")
    with pytest.raises(BaseImageMissing, match="stacx/not-built-anywhere:1"):
        await manager.create(SessionSpec(task_dir=str(root)))
    assert manager.list() == []


@pytest.mark.parametrize(
    ("test_sh", "error"),
    [
        ("echo no reward here\n", RewardFileMissing),
        ("mkdir -p /logs/verifier; : > /logs/verifier/reward.txt\n", RewardFileEmpty),
        ("mkdir -p /logs/verifier; echo great > /logs/verifier/reward.txt\n", RewardFileMalformed),
        ("mkdir -p /logs/verifier; echo '{\"reward\": ' > /logs/verifier/reward.json\n", RewardFileMalformed),
    ],
)
async def test_bad_reward_files_fail_clearly(
    manager: SessionManager, tmp_path: Path, test_sh: str, error: type
) -> None:
    root = _task(tmp_path, test_sh)
    info = await manager.create(SessionSpec(task_dir=str(root)))
    try:
        with pytest.raises(error):
            await manager.verify(info.id)
    finally:
        await manager.close(info.id)


def test_tasks_check_command_prints_both_rewards(
    capsys: pytest.CaptureFixture[str], sandbox_image: str
) -> None:
    from stacx.infra.cli import build_parser

    args = build_parser().parse_args(["tasks", "check", str(EXAMPLES / "write-file"), "--json"])
    assert args.func(args) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert '"oracle_reward": 1.0' in line and '"noop_reward": 0.0' in line and '"passed": true' in line
