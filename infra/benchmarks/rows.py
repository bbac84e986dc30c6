"""Rows of a suite's data file as its authors publish it: JSON Lines, a JSON array, one JSON
object (MATH's release: one problem per file), or Parquet (read with pyarrow). Each row comes
with where it is (`file:line`, `file: row N`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["DATA_SUFFIXES", "data_files", "natural_key", "read_rows"]

DATA_SUFFIXES = (".jsonl", ".json", ".parquet")


def data_files(path: Path) -> list[Path]:
    """`path` itself when it is a file; else the data files under it (any depth, sorted), only
    those of the test split when there are such: named `test*` (a Hugging Face dataset folder
    holds train and test) or under a `test/` folder (MATH's release: `test/<subject>/<n>.json`)."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        return []
    found = sorted((p for p in path.rglob("*") if p.is_file() and p.suffix in DATA_SUFFIXES),
                   key=lambda p: natural_key(p.relative_to(path).as_posix()))
    tests = [p for p in found if p.name.startswith("test") or "test" in p.relative_to(path).parts[:-1]]
    return tests or found


def natural_key(text: str) -> list[tuple[int, str]]:
    """A sort key that orders `2.json` before `10.json`."""
    return [(int(part), "") if part.isdigit() else (0, part) for part in re.split(r"(\d+)", text)]


def read_rows(path: Path) -> Iterator[tuple[str, dict[str, Any] | str]]:
    """(where, row) for every row of `path`; a row that is not an object comes as (where, problem)."""
    if path.suffix == ".parquet":
        yield from _parquet_rows(path)
    elif path.suffix == ".json":
        yield from _json_rows(path)
    else:
        yield from _jsonl_rows(path)


def _jsonl_rows(path: Path) -> Iterator[tuple[str, dict[str, Any] | str]]:
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{line_no}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            yield where, f"not valid JSON ({exc.msg}); each line holds one JSON object"
            continue
        yield where, row if isinstance(row, dict) else f"a JSON {type(row).__name__}, not an object"


def _json_rows(path: Path) -> Iterator[tuple[str, dict[str, Any] | str]]:
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        yield str(path), f"not valid JSON ({exc.msg} at line {exc.lineno})"
        return
    if isinstance(rows, dict):  # one problem per file (MATH's release layout)
        yield str(path), rows
        return
    if not isinstance(rows, list):
        yield str(path), f"holds a JSON {type(rows).__name__}; a .json file is an array of rows or one row"
        return
    for i, row in enumerate(rows):
        yield f"{path}: row {i}", row if isinstance(row, dict) else f"a {type(row).__name__}, not an object"


def _parquet_rows(path: Path) -> Iterator[tuple[str, dict[str, Any] | str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        yield str(path), f"not a readable Parquet file ({exc})"
        return
    for i, row in enumerate(table.to_pylist()):
        yield f"{path}: row {i}", row
