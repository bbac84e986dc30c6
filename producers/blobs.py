"""Blob store for the claim check: large encoded records live here, events carry the URL."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from producers.errors import BlobStoreError

__all__ = ["DEFAULT_BLOB_ENV", "FsspecBlobStore", "default_blob_url"]

DEFAULT_BLOB_ENV = "STACX_BLOBS"
"""Environment variable overriding the default blob store URL."""


def default_blob_url() -> str:
    """`$STACX_BLOBS`, else `$STACX_HOME/blobs` (STACX_HOME defaults to ~/.cache/stacx)."""
    if os.environ.get(DEFAULT_BLOB_ENV):
        return os.environ[DEFAULT_BLOB_ENV]
    home = Path(os.environ.get("STACX_HOME", Path.home() / ".cache" / "stacx"))
    return str(home / "blobs")


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
        folder = f"{self._root.rstrip('/')}/{prefix}" if prefix else self._root.rstrip("/")
        path = f"{folder}/{digest}.avro"
        try:
            self._fs.makedirs(folder, exist_ok=True)
            self._fs.pipe_file(path, data)
        except Exception as exc:  # fsspec backends raise OSError and their own errors
            raise BlobStoreError(f"cannot write blob {path} under {self.root_url!r}: {exc}") from exc
        return self._fs.unstrip_protocol(path), digest

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
