"""Build (and cache) the image of a Harbor task's environment/ with the local Docker engine.

Tags depend on the content of environment/ (`HarborTask.built_tag`), so an unchanged task is
built once and every later session or test run reuses the image. Builds use the host network
(the engine has no bridge) and never pull. A FROM image that is not available locally goes
through the base-image map (`ubuntu:24.04` -> a local Debian stand-in that `stacx tasks images
build` makes); one that is neither local nor mapped is a `BaseImageMissing` naming it and the fix.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stacx.sandbox.errors import BackendError, BaseImageMissing, ImageBuildError, InvalidSpec
from stacx.sandbox.tasks import HarborTask
from stacx.sandbox.terminal import clean_text

__all__ = [
    "DEFAULT_BASE_IMAGES",
    "PYTHON_DIR",
    "ImageChoice",
    "TaskImageBuilder",
    "from_images",
    "map_base_image",
    "rewrite_from",
]

LABEL_TASK = "stacx.task"
STAND_IN_DEBIAN = "stacx/base:debian-bookworm"
"""Local stand-in for ubuntu/debian base images (`stacx tasks images build`)."""
STAND_IN_PYTHON = "stacx/base:python3-bookworm"
"""Local stand-in for python base images."""
TOOLS_IMAGE = "stacx/harbor-tools:1"
"""Offline verifier tools (uv/uvx, pytest wheels, relocatable python3 and curl)."""
TOOLS_DIR = "/opt/stacx-tools"
"""Where Harbor task sandboxes see the tools image's content (read-only)."""
PYTHON_DIR = "/opt/stacx-python"
"""Where Harbor task sandboxes see the operator's extra Python interpreters (read-only): uv's
managed-Python layout, `<name>/bin/python3.X` per installation."""


DEFAULT_BASE_IMAGES: dict[str, str] = {
    "ubuntu": STAND_IN_DEBIAN,
    "ubuntu:*": STAND_IN_DEBIAN,
    "debian": STAND_IN_DEBIAN,
    "debian:*": STAND_IN_DEBIAN,
    "buildpack-deps:*": STAND_IN_DEBIAN,
    "python": STAND_IN_PYTHON,
    "python:*": STAND_IN_PYTHON,
}
"""FROM image (fnmatch pattern) -> local image used when the FROM image itself is not present."""


def map_base_image(image: str, base_images: dict[str, str]) -> str | None:
    """The local image `image` maps to (first matching pattern; `docker.io/library/` ignored)."""
    name = re.sub(r"^(docker\.io/)?(library/)?", "", image)
    if name in base_images:
        return base_images[name]
    return next((local for pattern, local in base_images.items() if fnmatch.fnmatchcase(name, pattern)), None)


def rewrite_from(text: str, replacements: dict[str, str]) -> str:
    """Dockerfile `text` with the image of each FROM line replaced per `replacements`."""

    def replace(match: re.Match[str]) -> str:
        return match.group(1) + replacements.get(match.group(2), match.group(2))

    return re.sub(r"(?im)^(\s*FROM\s+(?:--\S+\s+)*)(\S+)", replace, text)


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


@dataclass(kw_only=True, slots=True)
class ImageChoice:
    """The image a task runs in and how it was chosen."""

    tag: str
    notes: list[str] = field(default_factory=list)
    """One line each: base images mapped to stand-ins, docker_image fallback, missing tools."""


class TaskImageBuilder:
    """Ensures a task's image exists locally, building it at most once per content."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        base_url: str | None = None
        """Docker engine address (None: DOCKER_HOST or the local socket)."""
        base_images: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_BASE_IMAGES))
        """FROM image pattern -> local image, used when the FROM image is not present locally."""
        tools_image: str = TOOLS_IMAGE
        """Offline verifier tools mounted at TOOLS_DIR in Harbor sandboxes ('' : none)."""
        python_dir: str | None = None
        """Host directory of relocatable Python installations mounted at PYTHON_DIR in Harbor
        sandboxes, for a test.sh asking `uvx -p 3.12` (e.g. made on a machine with internet by
        `uv python install --install-dir DIR 3.12 3.13`; None: the tools' Python only)."""

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
        return (await self.resolve(task)).tag

    async def resolve(self, task: HarborTask) -> ImageChoice:
        """`ensure` with the notes on how the image was chosen."""
        lock = self._locks.setdefault(str(task.path), asyncio.Lock())
        async with lock:
            return await asyncio.to_thread(self.resolve_sync, task)

    def resolve_sync(self, task: HarborTask) -> ImageChoice:
        """Blocking form of `resolve`."""
        choice = ImageChoice(tag=task.built_tag)
        if task.docker_image:
            if self._exists(task.docker_image):
                return ImageChoice(tag=task.docker_image)
            if not task.dockerfile.is_file():
                raise BaseImageMissing(
                    f"{task.path / 'task.toml'}: [environment] docker_image {task.docker_image!r} is not "
                    "available locally and there is no environment/Dockerfile to build instead; "
                    "`docker load` it first (sandboxes have no registry access)"
                )
            choice.notes.append(
                f"docker_image {task.docker_image} is not local: built environment/Dockerfile"
            )
        if self._exists(choice.tag):
            choice.notes += self._mapping_notes(task)
            return choice
        replacements = self._base_replacements(task)
        choice.notes += [f"FROM {a} -> local stand-in {b}" for a, b in replacements.items()]
        self._build(task, choice.tag, replacements)
        return choice

    def _mapping_notes(self, task: HarborTask) -> list[str]:
        notes = []
        for image in from_images(task.dockerfile):
            local = map_base_image(image, self.config.base_images)
            if local and not self._exists(image):
                notes.append(f"FROM {image} -> local stand-in {local}")
        return notes

    def _base_replacements(self, task: HarborTask) -> dict[str, str]:
        replacements: dict[str, str] = {}
        for image in from_images(task.dockerfile):
            if self._exists(image):
                continue
            local = map_base_image(image, self.config.base_images)
            if local is None:
                raise BaseImageMissing(
                    f"{task.dockerfile}: FROM image {image!r} is not available locally, builds never "
                    "pull and no base-image map entry covers it; `docker load` it, or map it to a "
                    f"local image (TaskImageBuilder.Config.base_images / --base-image {image}=IMAGE)"
                )
            if not self._exists(local):
                raise BaseImageMissing(
                    f"{task.dockerfile}: FROM image {image!r} maps to the local stand-in {local!r}, "
                    "which is not built yet; run `stacx tasks images build`"
                )
            replacements[image] = local
        return replacements

    def tools_volume(self) -> str | None:
        """Name of a volume holding the verifier tools (created from `tools_image` once); None when
        that image is not built."""
        import docker.errors
        from docker.types import Mount

        if not self.config.tools_image:
            return None
        try:
            image = self._client.images.get(self.config.tools_image)
        except docker.errors.ImageNotFound:
            return None
        name = f"stacx-harbor-tools-{image.id.split(':')[-1][:12]}"
        try:
            self._client.volumes.get(name)
            return name
        except docker.errors.NotFound:
            pass
        self._client.volumes.create(name, labels={"stacx.tools": self.config.tools_image})
        mount = Mount(target=TOOLS_DIR, source=name, type="volume")
        filler = self._client.containers.create(
            image.id, command=["true"], mounts=[mount], network_mode="none"
        )
        filler.remove(force=True)
        return name

    def python_volume(self) -> str | None:
        """Name of a volume that shows `python_dir` (a bind of the host directory, made once);
        None when no python_dir is configured."""
        import docker.errors

        if not self.config.python_dir:
            return None
        source = Path(self.config.python_dir).expanduser().resolve()
        if not source.is_dir():
            raise InvalidSpec(
                f"python_dir {self.config.python_dir!r} is not a directory on the gateway host; give a "
                "directory of Python installations (`uv python install --install-dir DIR 3.12`)"
            )
        name = f"stacx-python-{hashlib.sha256(str(source).encode()).hexdigest()[:12]}"
        try:
            self._client.volumes.get(name)
        except docker.errors.NotFound:
            options = {"type": "none", "o": "bind", "device": str(source)}
            self._client.volumes.create(
                name, driver="local", driver_opts=options, labels={"stacx.python": str(source)}
            )
        return name

    def _exists(self, image: str) -> bool:
        import docker.errors

        try:
            self._client.images.get(image)
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.APIError as exc:
            raise BackendError(f"inspecting image {image!r} failed: {exc}") from exc
        return True

    def _build(self, task: HarborTask, tag: str, replacements: dict[str, str]) -> None:
        with tempfile.TemporaryDirectory(prefix="stacx-dockerfile-") as tmp:
            dockerfile = Path(tmp) / "Dockerfile"
            dockerfile.write_text(rewrite_from(task.dockerfile.read_text(), replacements))
            self._stream_build(task, tag, dockerfile)

    def _stream_build(self, task: HarborTask, tag: str, dockerfile: Path) -> None:
        import docker.errors
        import requests.exceptions
        import urllib3.exceptions

        where = f"building {tag} from {task.dockerfile}"
        deadline = time.monotonic() + task.build_timeout_s
        log: list[str] = []
        try:
            stream = self._client.api.build(
                path=str(task.environment_dir),
                dockerfile=str(dockerfile),
                tag=tag,
                network_mode="host",
                pull=False,
                rm=True,
                forcerm=True,
                timeout=int(task.build_timeout_s) + 5,
                labels={LABEL_TASK: task.name},
                decode=True,
            )
            for entry in stream:
                log.append(_log_text(entry))
                if isinstance(entry, dict) and entry.get("error"):
                    error = clean_text(entry["error"]).strip()
                    raise ImageBuildError(f"{where} failed: {error}\n{_tail(log)}")
                if time.monotonic() > deadline:
                    raise ImageBuildError(_timeout_message(where, task, log))
        except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, TimeoutError) as exc:
            # The engine stream goes quiet past the HTTP timeout: urllib3's ReadTimeoutError while
            # iterating, requests' ReadTimeout / ConnectionError while connecting.
            raise ImageBuildError(_timeout_message(where, task, log)) from exc
        except docker.errors.APIError as exc:
            raise ImageBuildError(f"{where} failed: {exc}\n{_tail(log)}") from exc
        if not self._exists(tag):
            raise ImageBuildError(f"{where} ended without an image\n{_tail(log)}")


def _timeout_message(where: str, task: HarborTask, log: list[str]) -> str:
    return (
        f"{where} did not finish within build_timeout_sec = {task.build_timeout_s:g} s "
        f"([environment] of {task.path / 'task.toml'}); raise it or make the build faster\n{_tail(log)}"
    )


def _tail(log: list[str]) -> str:
    return clean_text("".join(log))[-1500:]


def _log_text(entry: Any) -> str:
    if isinstance(entry, dict):
        return str(entry.get("stream") or entry.get("error") or "")
    return re.sub(r"\s+$", "\n", str(entry))
