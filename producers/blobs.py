"""Blob store for the claim check: large encoded records live here, events carry the URL.

One setting for every service: the fsspec root URL in `$STACX_BLOBS` (or each component's
`blob_store_url`). The default, a folder under `$STACX_HOME`, only works on one machine: past
one machine every producer, assembler, trainer and consumer must reach the same store, e.g.
`STACX_BLOBS=s3://bucket/stacx-blobs` (credentials the usual fsspec/boto way) or a shared mount.

Layout: `<root>/<topic>/<sha256>.avro`, so a blob's lifecycle follows its topic: `stacx topics
gc` removes blobs no retained record of the topic refers to any more.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stacx.producers.errors import BlobStoreError

__all__ = ["DEFAULT_BLOB_ENV", "BlobInfo", "FsspecBlobStore", "default_blob_url", "is_local_url"]

log = logging.getLogger(__name__)

DEFAULT_BLOB_ENV = "STACX_BLOBS"
"""Environment variable naming the blob store URL shared by every service."""
_SUFFIX = ".avro"


def default_blob_url() -> str:
    """`$STACX_BLOBS`, else `$STACX_HOME/blobs` (STACX_HOME defaults to ~/.cache/stacx)."""
    if os.environ.get(DEFAULT_BLOB_ENV):
        return os.environ[DEFAULT_BLOB_ENV]
    home = Path(os.environ.get("STACX_HOME", Path.home() / ".cache" / "stacx"))
    return str(home / "blobs")


def is_local_url(url: str) -> bool:
    """True for a store only this machine can read (a plain path or file://)."""
    return "://" not in url or url.startswith(("file://", "local://"))


@dataclass(frozen=True, slots=True)
class BlobInfo:
    """One stored blob."""

    url: str
    sha256: str
    size: int
    modified: float | None
    """Unix time of the last write, when the file system reports it."""


class FsspecBlobStore:
    """Content-addressed blobs under an fsspec root (a local directory, s3://bucket/prefix, ...).

    Blobs are named by their SHA-256, so re-publishing the same record writes the same blob.
    """

    def __init__(self, root_url: str | None = None) -> None:
        import fsspec

        self.root_url = root_url or default_blob_url()
        self._fs, self._root = fsspec.core.url_to_fs(self.root_url)

    def put(self, data: bytes, *, prefix: str = "") -> tuple[str, str]:
        """Store `data`; returns (url, sha256 hex)."""
        digest = hashlib.sha256(data).hexdigest()
        folder = self._folder(prefix)
        path = f"{folder}/{digest}{_SUFFIX}"
        try:
            self._fs.makedirs(folder, exist_ok=True)
            self._write(path, data)
        except Exception as exc:  # fsspec backends raise OSError and their own errors
            raise BlobStoreError(f"cannot write blob {path} under {self.root_url!r}: {exc}") from exc
        return self._fs.unstrip_protocol(path), digest

    def _write(self, path: str, data: bytes) -> None:
        """Write `path` whole or not at all. On a local file system a write that fails half way
        (a full disk) would leave a partial blob under the final name: write a temporary file
        beside it and rename it into place. Object stores only ever show complete objects."""
        from fsspec.implementations.local import LocalFileSystem

        if not isinstance(self._fs, LocalFileSystem):
            self._fs.pipe_file(path, data)
            return
        partial = f"{path}.partial-{uuid.uuid4().hex[:12]}"
        try:
            with open(partial, "wb") as out:
                out.write(data)
            os.replace(partial, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise

    def copy(self, url: str, *, prefix: str, sha256: str | None = None) -> tuple[str, str]:
        """Copy the blob at `url` (checked against `sha256`) under `prefix`: (url, sha256)."""
        return self.put(self.get(url, sha256=sha256), prefix=prefix)

    def list_blobs(self, prefix: str) -> list[BlobInfo]:
        """Every blob under `prefix` (none when the folder does not exist)."""
        folder = self._folder(prefix)
        try:
            entries = self._fs.ls(folder, detail=True)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise BlobStoreError(f"cannot list blobs under {folder}: {exc}") from exc
        return [_info(self._fs, e) for e in entries if str(e.get("name", "")).endswith(_SUFFIX)]

    def prefixes(self) -> list[str]:
        """The folders directly under the root (one per topic)."""
        try:
            entries = self._fs.ls(self._root.rstrip("/"), detail=True)
        except FileNotFoundError:
            return []
        return sorted(
            str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory"
        )

    def delete(self, url: str) -> None:
        import fsspec

        try:
            fs, path = fsspec.core.url_to_fs(url)
            fs.rm_file(path)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise BlobStoreError(f"cannot delete blob {url}: {exc}") from exc

    def _folder(self, prefix: str) -> str:
        return f"{self._root.rstrip('/')}/{prefix}" if prefix else self._root.rstrip("/")

    @staticmethod
    def get(url: str, *, sha256: str | None = None) -> bytes:
        """Read the blob at `url`, checking its SHA-256 when given."""
        import fsspec

        try:
            fs, path = fsspec.core.url_to_fs(url)
            data: bytes = fs.cat_file(path)
        except Exception as exc:
            raise BlobStoreError(f"cannot read claim-check blob {url}: {exc}") from exc
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
            raise BlobStoreError(f"claim-check blob {url} is corrupt: SHA-256 mismatch")
        return data


def _info(fs: Any, entry: dict[str, Any]) -> BlobInfo:
    name = str(entry["name"])
    modified: Any = entry.get("mtime") or entry.get("LastModified") or entry.get("last_modified")
    if modified is not None and hasattr(modified, "timestamp"):  # object stores give a datetime
        modified = modified.timestamp()
    return BlobInfo(
        url=fs.unstrip_protocol(name),
        sha256=name.rsplit("/", 1)[-1].removesuffix(_SUFFIX),
        size=int(entry.get("size") or 0),
        modified=float(modified) if modified is not None else None,
    )
