"""A blob is written whole or not at all: a write that fails half way (a full disk) leaves no
partial blob under its final name, and no stray file either."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from stacx.producers.blobs import FsspecBlobStore

REPO = Path(__file__).resolve().parents[3]


def test_a_write_cut_off_by_the_file_size_limit_leaves_no_partial_blob(tmp_path: Path) -> None:
    """RLIMIT_FSIZE stops a write at 4 KiB with EFBIG, as a full disk stops it with ENOSPC
    (in a child process: the limit is per process)."""
    script = textwrap.dedent(
        f"""
        import resource, signal
        from stacx.producers.blobs import FsspecBlobStore
        from stacx.producers.errors import BlobStoreError

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of the process
        store = FsspecBlobStore({str(tmp_path)!r})
        store.put(b"small", prefix="topic")  # the folder exists before the limit
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            store.put(b"x" * 100_000, prefix="topic")
        except BlobStoreError as exc:
            print("refused:", exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "refused: cannot write blob" in done.stdout, done.stdout
    files = sorted(p.name for p in (tmp_path / "topic").iterdir())
    (small,) = FsspecBlobStore(str(tmp_path)).list_blobs("topic")
    assert files == [Path(small.url).name], files  # only the blob written before the limit


def test_a_blob_is_renamed_into_place_and_read_back(tmp_path: Path) -> None:
    store = FsspecBlobStore(str(tmp_path))
    url, digest = store.put(b"payload" * 1000, prefix="topic")
    assert FsspecBlobStore.get(url, sha256=digest) == b"payload" * 1000
    assert [p.name for p in (tmp_path / "topic").iterdir()] == [f"{digest}.avro"]
