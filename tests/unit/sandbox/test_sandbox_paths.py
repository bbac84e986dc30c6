"""Path and archive checks: everything that could escape a sandbox is refused before it runs."""

from __future__ import annotations

import io
import tarfile

import pytest

from stacx.sandbox.errors import PathRejected
from stacx.sandbox.paths import check_archive, resolve_path, tar_directory, tar_files


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("a.txt", "/workspace/a.txt"),
        ("dir/b.txt", "/workspace/dir/b.txt"),
        ("./c", "/workspace/c"),
        ("/workspace/x", "/workspace/x"),
        ("/tmp/y", "/tmp/y"),
        ("/tests/test.sh", "/tests/test.sh"),
        ("/logs/verifier/reward.txt", "/logs/verifier/reward.txt"),
    ],
)
def test_paths_inside_roots_resolve(path: str, expected: str) -> None:
    assert resolve_path(path, "/workspace") == expected


@pytest.mark.parametrize(
    "path",
    ["../etc/passwd", "a/../../b", "/etc/passwd", "/workspace/../etc", "/workspacex/a", "", "a\x00b", "/"],
)
def test_paths_escaping_roots_are_rejected(path: str) -> None:
    with pytest.raises(PathRejected):
        resolve_path(path, "/workspace")


def _archive(*members: tarfile.TarInfo) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for member in members:
            archive.addfile(member, io.BytesIO(b"x" * member.size) if member.isfile() else None)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = 1 if kind == tarfile.REGTYPE else 0
    info.linkname = link
    return info


def test_plain_archive_is_accepted() -> None:
    assert check_archive(tar_files({"a.txt": b"1", "d/b.txt": b"2"})) == 2


@pytest.mark.parametrize(
    "member",
    [
        _member("/etc/cron.d/x"),
        _member("../outside"),
        _member("ok/../../outside"),
        _member("link", tarfile.SYMTYPE, "/etc/passwd"),
        _member("hard", tarfile.LNKTYPE, "/etc/shadow"),
        _member("dev", tarfile.CHRTYPE),
        _member("fifo", tarfile.FIFOTYPE),
    ],
)
def test_dangerous_archive_members_are_rejected(member: tarfile.TarInfo) -> None:
    with pytest.raises(PathRejected, match=member.name.split("/")[0] or "/"):
        check_archive(_archive(member))


def test_garbage_is_not_an_archive() -> None:
    with pytest.raises(PathRejected, match="tar"):
        check_archive(b"not a tar file at all" * 40)


def test_tar_directory_round_trips(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f.txt").write_text("hello")
    (tmp_path / "g.sh").write_text("echo")
    with tarfile.open(fileobj=io.BytesIO(tar_directory(tmp_path))) as archive:
        names = sorted(archive.getnames())
        content = archive.extractfile("sub/f.txt").read()  # type: ignore[union-attr]
    assert names == ["g.sh", "sub", "sub/f.txt"]
    assert content == b"hello"
