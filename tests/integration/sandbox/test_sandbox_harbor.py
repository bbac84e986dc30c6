"""Harbor tasks on the real engine: every single-container cookbook recipe passes oracle/no-op
parity through `stacx tasks check` offline (stand-in base images, verifier tools), the
multi-container ones are refused clearly; Harbor sandbox semantics; ENTRYPOINT, build timeout and
docker_image fallback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from harbor_cookbook import MULTI_CONTAINER, SINGLE_CONTAINER, cookbook

from stacx.sandbox.backends import DockerBackend
from stacx.sandbox.backends.docker import HARBOR_CAPS
from stacx.sandbox.checks import check_task
from stacx.sandbox.errors import ImageBuildError
from stacx.sandbox.images import TaskImageBuilder
from stacx.sandbox.models import SessionSpec
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.tasks import load_task

STACX = str(Path(sys.executable).with_name("stacx"))

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "tasks"
_CAP_BITS = {
    "CHOWN": 0,
    "DAC_OVERRIDE": 1,
    "FOWNER": 3,
    "FSETID": 4,
    "KILL": 5,
    "SETGID": 6,
    "SETUID": 7,
    "NET_BIND_SERVICE": 10,
}


@pytest.fixture(scope="module")
def harbor_images(sandbox_image: str) -> None:
    """The stand-in base images and the verifier tools image (built once per machine)."""
    from stacx.infra.services import harbor_images as builder

    builder.build()


@pytest.fixture
async def manager(harbor_images: None) -> AsyncIterator[SessionManager]:
    backend = DockerBackend()
    config = SessionManager.Config(owner=f"test-harbor-{uuid.uuid4().hex[:8]}")
    async with SessionManager(config, backend, images=TaskImageBuilder()) as mgr:
        yield mgr
    await backend.close()


def test_cookbook_parity_through_tasks_check(harbor_images: None, capsys: pytest.CaptureFixture[str]) -> None:
    from stacx.infra.cli import build_parser

    args = build_parser().parse_args(["tasks", "check", str(cookbook()), "--json", "--jobs", "2"])
    assert args.func(args) == 1  # the multi-container recipes are refused, so not all pass
    rows = {r["path"].rsplit("/", 1)[-1]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert sorted(rows) == sorted(SINGLE_CONTAINER + MULTI_CONTAINER)
    for name in SINGLE_CONTAINER:
        row = rows[name]
        assert (row["oracle_reward"], row["noop_reward"], row["passed"], row["error"]) == (
            1.0,
            0.0,
            True,
            None,
        ), row
        assert row["image"].startswith("stacx-task/")
    for name in MULTI_CONTAINER:
        assert rows[name]["passed"] is False
        assert "docker-compose" in rows[name]["error"] and "not supported yet" in rows[name]["error"]
    assert rows["multi-reward"]["oracle_rewards"] == {"correctness": 1.0, "performance": 1.0}
    assert rows["multi-step"]["oracle_steps"] == {"scaffold": 1.0, "implement": 1.0, "document": 1.0}
    assert any("ubuntu:24.04 -> local stand-in" in w for w in rows["simple-task"]["warnings"])


async def test_harbor_sandbox_semantics(manager: SessionManager) -> None:
    info = await manager.create(SessionSpec(task_dir=str(cookbook() / "simple-task")))
    try:
        assert info.harbor and info.workdir == "/app"
        probe = await manager.exec(
            info.id, "id -u; pwd; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; ls /sys/class/net"
        )
        lines = probe.stdout.split()
        assert lines[:2] == ["0", "/app"]
        caps = int(probe.stdout.split("CapEff:")[1].split()[0], 16)
        assert caps == sum(1 << _CAP_BITS[c] for c in HARBOR_CAPS)
        assert "NoNewPrivs:\t1" in probe.stdout and probe.stdout.rstrip().endswith("lo")
        tools = await manager.exec(info.id, "/opt/stacx-tools/bin/uv --version && touch /opt/stacx-tools/x")
        assert tools.stdout.startswith("uv ") and "Read-only file system" in tools.stderr
        written = await manager.exec(
            info.id, "echo hi > /usr/local/x && mkdir -p /solution && cat /usr/local/x"
        )
        assert written.ok and written.stdout == "hi\n"  # writable root, as Harbor tasks expect
    finally:
        await manager.close(info.id)


def _task(tmp_path: Path, dockerfile: str, toml_extra: str = "") -> Path:
    root = tmp_path / "task"
    shutil.copytree(EXAMPLES / "write-file", root)
    (root / "environment" / "Dockerfile").write_text(dockerfile)
    keys = {line.split("=")[0].strip() for line in toml_extra.splitlines()}
    kept = [
        line
        for line in (root / "task.toml").read_text().splitlines()
        if line.split("=")[0].strip() not in keys
    ]
    toml = "\n".join(kept).replace("[environment]", f"[environment]\n{toml_extra}") + "\n"
    (root / "task.toml").write_text(toml)
    return root


async def test_entrypoint_that_exits_is_replaced_and_reported(
    manager: SessionManager, tmp_path: Path
) -> None:
    root = _task(tmp_path, 'FROM stacx/sandbox:bookworm\nENTRYPOINT ["/bin/echo", "bye"]\nWORKDIR /app\n')
    check = await check_task(manager, load_task(root))
    assert check.passed, check
    assert any("ENTRYPOINT" in w and "exited at start" in w for w in check.warnings)


async def test_build_timeout_is_a_clear_error(manager: SessionManager, tmp_path: Path) -> None:
    marker = uuid.uuid4().hex  # a new layer every run, so the build cache cannot answer
    root = _task(
        tmp_path, f"FROM stacx/sandbox:bookworm\nRUN sleep 20 && echo {marker}\n", "build_timeout_sec = 2\n"
    )
    with pytest.raises(ImageBuildError, match="did not finish within build_timeout_sec = 2 s"):
        await manager.create(SessionSpec(task_dir=str(root)))


async def test_missing_docker_image_falls_back_to_the_dockerfile(
    manager: SessionManager, tmp_path: Path
) -> None:
    dockerfile = (EXAMPLES / "write-file" / "environment" / "Dockerfile").read_text()
    root = _task(tmp_path, dockerfile, 'docker_image = "stacx/not-here-anywhere:1"\n')
    check = await check_task(manager, load_task(root))
    assert check.passed, check
    assert check.image is not None and check.image.startswith("stacx-task/")
    assert any("not local: built environment/Dockerfile" in w for w in check.warnings)


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_sigterm_during_tasks_check_leaves_no_container(
    sigint: str, harbor_images: None, docker_client: Any
) -> None:
    """SIGTERM mid-check stops it like Ctrl-C: the sandbox is removed, one line, status 143; also
    when SIGINT is ignored (a background job of a non-interactive shell)."""
    import signal
    import time

    from stacx.sandbox.backends.docker import LABEL_OWNER

    def ignore_sigint() -> None:
        if sigint == "ignored":
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(
        [STACX, "tasks", "check", str(cookbook() / "simple-task")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=ignore_sigint,
    )
    owner = {"label": f"{LABEL_OWNER}=stacx-tasks-check-{proc.pid}"}
    deadline = time.monotonic() + 300
    # the engine's own list (one call): docker-py's `containers.list` inspects each container
    # after listing, and the check's short-lived sandboxes can be gone by then (NotFound)
    while not docker_client.api.containers(all=True, filters=owner):
        assert proc.poll() is None and time.monotonic() < deadline, "the check never started a sandbox"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, output
    assert "stacx tasks: stopped by SIGTERM" in output and "Traceback" not in output
    assert "tasks passed" not in output  # it stopped, it did not run to the end
    assert docker_client.api.containers(all=True, filters=owner) == []
