"""Readers compiled to C (schemas/_native.py): a Codec really uses them, they are built once
and cached, and a machine that cannot build them says why and still decodes."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

import pytest
from events_strategies import comparable, trajectory

from schemas import _native
from schemas import codec as codec_module
from schemas._reader import compile_reader
from schemas.codec import Codec, builtin_schemas, encode
from schemas.errors import NativeBuildError
from schemas.records import Trajectory


def _trajectory_schema() -> Any:
    return next(i for i in builtin_schemas() if i.name == "stacx.Trajectory")


class _Box:
    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def _fresh_schema(tag: str) -> dict[str, Any]:
    """A schema no other test compiled (a new source: nothing cached in this process)."""
    return {"type": "record", "name": f"Fresh{tag}", "namespace": "t",
            "fields": [{"name": "s", "type": "string"}, {"name": "v", "type": "long"}]}  # fmt: skip


def test_a_codec_decodes_with_the_reader_compiled_to_c() -> None:
    """The default codec must not quietly fall back to the Python-run reader."""
    codec = Codec()
    reader = codec._compiled_reader(_trajectory_schema())
    assert not inspect.isfunction(reader), "the Trajectory reader is a Python function: not compiled"
    assert inspect.isfunction(Codec(native_readers=False)._compiled_reader(_trajectory_schema()))
    record = trajectory(4)
    assert comparable(codec.decode(encode(record), Trajectory)) == comparable(record)


def test_a_reader_is_built_once_then_loaded_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STACX_READERS_DIR", str(tmp_path / "avro-readers"))
    monkeypatch.setattr(_native, "_loaded", {})
    schema = _fresh_schema("Cached")
    read = compile_reader(schema, {"t.FreshCached": _Box}, native=True)
    assert (read(b"\x04ab\x07", 0)[0].__dict__) == {"s": "ab", "v": -4}
    built = list((tmp_path / "avro-readers").glob("_stacx_avro_*"))
    assert len(built) == 1
    monkeypatch.setattr(_native, "_loaded", {})
    monkeypatch.setattr(_native, "_build", _must_not_build)
    again = compile_reader(schema, {"t.FreshCached": _Box}, native=True)
    assert again(b"\x02z\x02", 0)[0].__dict__ == {"s": "z", "v": 1}


def _must_not_build(*args: object) -> None:
    raise AssertionError("rebuilt a reader that is in the cache")


def test_a_missing_compiler_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACX_READERS_DIR", str(tmp_path / "avro-readers"))
    monkeypatch.setattr(_native.shutil, "which", lambda name: None)
    with pytest.raises(NativeBuildError, match=r"no C compiler .*apt-get install gcc") as error:
        compile_reader(_fresh_schema("NoCompiler"), {"t.FreshNoCompiler": _Box}, native=True)
    assert "\n" not in str(error.value)


def test_a_codec_that_cannot_compile_warns_once_and_still_decodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("STACX_READERS_DIR", str(tmp_path / "avro-readers"))
    monkeypatch.setattr(_native, "_loaded", {})
    monkeypatch.setattr(_native.shutil, "which", lambda name: None)
    monkeypatch.setattr(codec_module, "_native_failure", None)
    record = trajectory(5)
    with caplog.at_level(logging.WARNING, logger="schemas.codec"):
        decoded = Codec().decode(encode(record), Trajectory)
        Codec().decode(encode(record), Trajectory)
    assert comparable(decoded) == comparable(record)
    warnings = [r.getMessage() for r in caplog.records if "pure Python" in r.getMessage()]
    assert len(warnings) == 1 and "no C compiler" in warnings[0]


def test_builtin_readers_build_from_the_setup_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make setup` runs `python -m schemas._native`: it fails with one line, naming the fix."""
    monkeypatch.setenv("STACX_READERS_DIR", str(tmp_path / "avro-readers"))
    monkeypatch.setattr(_native, "_loaded", {})
    monkeypatch.setattr(_native.importlib.util, "find_spec", lambda name: None)
    assert _native.main() == 1
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "Cython is not installed" in error and "make setup" in error
