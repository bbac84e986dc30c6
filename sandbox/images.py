"""Build (and cache) the image of a Harbor task's environment/ with the local Docker engine.

Tags depend on the content of environment/ (`HarborTask.image_tag`), so an unchanged task is
built once and every later session or test run reuses the image. Builds use the host network
(the engine has no bridge) and never pull: a FROM image that is not available locally is an
error naming it.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.errors import BackendError, BaseImageMissing, ImageBuildError
from sandbox.tasks import HarborTask

__all__ = ["TaskImageBuilder", "from_images"]

LABEL_TASK = "stacx.task"


def from_images(dockerfile: Path) -> list[str]:
    """External images named by FROM lines (stage aliases, `scratch` and `$ARG`s left out)."""
    stages: set[str] = set()
    images: list[str] = []
    for line in dockerfile.read_text().splitlines():
        words = line.strip().split()
        if not words or words[0].upper() != "FROM":
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if not args:
            continue
        image = args[0]
        if len(args) >= 3 and args[1].upper() == "AS":
            stages.add(args[2].lower())
        if image.lower() in stages or image == "scratch" or "$" in image:
            continue
        images.append(image)
    return images


class TaskImageBuilder:
    """Ensures a task's image exists locally, building it at most once per content."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        base_url: str | None = None
        """Docker engine address (None: DOCKER_HOST or the local socket)."""

    def __init__(self, config: Config | None = None, *, client: Any = None) -> None:
        import docker

        self.config = config or TaskImageBuilder.Config()
        if client is None:
            url = self.config.base_url
            client = docker.DockerClient(base_url=url) if url else docker.from_env()
        self._client = client
        self._locks: dict[str, asyncio.Lock] = {}

    async def ensure(self, task: HarborTask) -> str:
        """The task's image tag, built now if missing."""
        tag = task.image_tag
        lock = self._locks.setdefault(tag, asyncio.Lock())
        async with lock:
            await asyncio.to_thread(self.ensure_sync, task)
        return tag

    def ensure_sync(self, task: HarborTask) -> str:
        """Blocking form of `ensure`."""
        tag = task.image_tag
        if self._exists(tag):
            return tag
        if task.docker_image:
            raise BaseImageMissing(
                f"{task.path / 'task.toml'}: [environment] docker_image {tag!r} is not available "
                "locally; load or build it first (sandboxes have no registry access)"
            )
        for image in from_images(task.dockerfile):
            if not self._exists(image):
                raise BaseImageMissing(
                    f"{task.dockerfile}: FROM image {image!r} is not available locally and builds "
                    "never pull; build or load it first (`stacx infra up` builds "
                    "stacx/sandbox:bookworm)"
                )
        self._build(task, tag)
        return tag

    def _exists(self, image: str) -> bool:
        import docker.errors

        try:
            self._client.images.get(image)
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.APIError as exc:
            raise BackendError(f"inspecting image {image!r} failed: {exc}") from exc
        return True

    def _build(self, task: HarborTask, tag: str) -> None:
        import docker.errors

        try:
            self._client.images.build(
                path=str(task.environment_dir),
                tag=tag,
                network_mode="host",
                pull=False,
                rm=True,
                forcerm=True,
                timeout=int(task.build_timeout_s),
                labels={LABEL_TASK: task.name},
            )
        except docker.errors.BuildError as exc:
            tail = "".join(_log_text(entry) for entry in exc.build_log)[-1500:]
            raise ImageBuildError(f"building {tag} from {task.dockerfile} failed: {exc}\n{tail}") from exc
        except docker.errors.APIError as exc:
            raise ImageBuildError(f"building {tag} from {task.dockerfile} failed: {exc}") from exc


def _log_text(entry: Any) -> str:
    if isinstance(entry, dict):
        return str(entry.get("stream") or entry.get("error") or "")
    return re.sub(r"\s+$", "\n", str(entry))
