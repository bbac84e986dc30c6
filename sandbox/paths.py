"""Path and archive checks applied before anything reaches a sandbox."""

from __future__ import annotations

import io
import posixpath
import tarfile
from pathlib import Path

from stacx.sandbox.errors import PathRejected

__all__ = ["EXTRA_WRITABLE_ROOTS", "check_archive", "resolve_path", "tar_directory", "tar_files"]

EXTRA_WRITABLE_ROOTS = ("/tmp", "/tests", "/logs", "/solution")
"""Writable directories of every sandbox besides its workdir (tests, verifier logs, reference solution)."""


def resolve_path(path: str, workdir: str, *, anywhere: bool = False) -> str:
    """Absolute path inside the sandbox for `path` (relative to `workdir`), or `PathRejected`.

    Paths must stay under the workdir or one of `EXTRA_WRITABLE_ROOTS` (any absolute path when
    `anywhere`: Harbor sandboxes, whose whole file system is the task's); `..` components and NUL
    bytes are refused outright rather than normalised away.
    """
    if not path or "\x00" in path:
        raise PathRejected(f"path {path!r} is empty or contains a NUL byte")
    if ".." in path.split("/"):
        raise PathRejected(f"path {path!r} contains '..'; give a path inside the sandbox workdir")
    full = posixpath.normpath(posixpath.join(workdir, path))
    if anywhere:
        return full
    for root in (workdir, *EXTRA_WRITABLE_ROOTS):
        if full == root or full.startswith(root.rstrip("/") + "/"):
            return full
    roots = ", ".join((workdir, *EXTRA_WRITABLE_ROOTS))
    raise PathRejected(f"path {path!r} is outside the sandbox's writable roots ({roots})")


def check_archive(data: bytes) -> int:
    """Number of members of a tar archive that holds only plain files and directories at safe
    relative paths; `PathRejected` naming the first offending member otherwise."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            members = archive.getmembers()
    except tarfile.TarError as exc:
        raise PathRejected(f"upload is not a readable tar archive: {exc}") from exc
    for member in members:
        name = member.name
        if name.startswith("/") or ".." in name.split("/") or "\x00" in name:
            raise PathRejected(f"archive member {name!r} escapes the target directory")
        if not (member.isfile() or member.isdir()):
            raise PathRejected(
                f"archive member {name!r} is a link or special file; only files and directories"
            )
    return len(members)


def tar_directory(directory: Path) -> bytes:
    """A tar archive of `directory`'s content (members relative to it, links followed)."""
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", dereference=True) as archive:
        for child in sorted(directory.rglob("*")):
            archive.add(child, arcname=child.relative_to(directory).as_posix(), recursive=False)
    return buffer.getvalue()


def tar_files(files: dict[str, bytes], *, mode: int = 0o644) -> bytes:
    """A tar archive holding `files` (relative name -> content)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = mode
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()
