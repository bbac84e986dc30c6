"""A host directory of Python installations (`--python-dir`) reaches Harbor sandboxes on the real
engine: read-only at /opt/stacx-python, and the verifier puts its interpreters where uv looks."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stacx.sandbox.errors import InvalidSpec
from stacx.sandbox.images import PYTHON_DIR, TaskImageBuilder


@pytest.fixture
def python_dir(tmp_path: Path, docker_client: Any) -> Iterator[Path]:
    root = tmp_path / f"pythons-{uuid.uuid4().hex[:8]}"
    interpreter = root / "cpython-3.13.0-linux-x86_64-gnu" / "bin" / "python3.13"
    interpreter.parent.mkdir(parents=True)
    interpreter.write_text("#!/bin/sh\necho 'Python 3.13.0'\n")
    interpreter.chmod(0o755)
    yield root
    for volume in docker_client.volumes.list(filters={"label": f"stacx.python={root.resolve()}"}):
        volume.remove(force=True)


def test_a_python_dir_is_seen_read_only_in_the_sandbox(
    python_dir: Path, sandbox_image: str, docker_client: Any
) -> None:
    from docker.types import Mount

    builder = TaskImageBuilder(TaskImageBuilder.Config(python_dir=str(python_dir)))
    volume = builder.python_volume()
    assert volume is not None and builder.python_volume() == volume  # made once
    script = (
        f'for b in {PYTHON_DIR}/*/bin; do PATH="$PATH:$b"; done; python3.13; '
        f"touch {PYTHON_DIR}/x 2>/dev/null && echo writable || echo read-only"
    )
    output = docker_client.containers.run(
        sandbox_image,
        ["bash", "-c", script],
        mounts=[Mount(target=PYTHON_DIR, source=volume, type="volume", read_only=True)],
        network_mode="none",
        remove=True,
        labels={"stacx.test": "python-dir"},
    )
    assert output.decode().split() == ["Python", "3.13.0", "read-only"]


def test_a_python_dir_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    builder = TaskImageBuilder(TaskImageBuilder.Config(python_dir=str(tmp_path / "missing")))
    with pytest.raises(InvalidSpec, match="python_dir .* is not a directory on the gateway host"):
        builder.python_volume()
