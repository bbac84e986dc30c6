"""Mutation score of the last `mutmut run` (read from mutants/**/*.meta), per module and in all.

Killed = the tests failed (or hung past mutmut's timeout) with the mutant in place. Survived,
no tests (no selected test runs the mutated function) and not checked count against the score.
Prints a table, or JSON with --json."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

KILLED_CODES = {1, 3}
TIMEOUT_CODES = {-24, 24, 36, 152, 255}
STATUS = {0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 37: "type check", None: "not checked"}


def _status(code: int | None) -> str:
    if code in KILLED_CODES:
        return "killed"
    if code in TIMEOUT_CODES:
        return "timeout"
    return STATUS.get(code, "suspicious")


def score(root: Path) -> dict[str, dict[str, int]]:
    """Counts by status for each mutated module under `root` (the mutants/ folder)."""
    out: dict[str, dict[str, int]] = {}
    for meta in sorted(root.rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"].values()
        module = meta.relative_to(root).as_posix().removesuffix(".meta")
        out[module] = dict(Counter(_status(c) for c in codes))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mutants", type=Path, default=Path("mutants"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.mutants.is_dir():
        print(f"mutation score: no {args.mutants}/ folder: run `make mutation` first", file=sys.stderr)
        return 2
    table = score(args.mutants)
    total = Counter[str]()
    for counts in table.values():
        total.update(counts)
    rows = {**table, "all": dict(total)}
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
        return 0
    print(f"{'module':40} {'killed':>7} {'total':>6} {'score':>7}  survived/no tests/timeout/not checked")
    for name, c in rows.items():
        n = sum(c.values())
        detected = c.get("killed", 0) + c.get("timeout", 0)
        rest = "/".join(str(c.get(k, 0)) for k in ("survived", "no tests", "timeout", "not checked"))
        print(f"{name:40} {detected:>7} {n:>6} {100 * detected / max(n, 1):>6.1f}%  {rest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
