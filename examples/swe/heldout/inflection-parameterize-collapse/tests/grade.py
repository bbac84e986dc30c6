"""SWE-bench's rule on a pytest `-rA` report (runs in the sandbox: standard library only).

    python3 grade.py config.json pytest.log /logs/verifier

config.json holds FAIL_TO_PASS and PASS_TO_PASS; the task is resolved when every test of both
passed (a test missing from the report did not pass). Writes reward.json (reward 1 or 0, and the
fail_to_pass and pass_to_pass fractions) to the output directory.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

_STATUS = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+)", re.MULTILINE)
_PASSING = {"PASSED", "XFAIL"}


def parse_pytest_report(text: str) -> dict[str, str]:
    """Test id -> status from pytest's `-rA` short summary (`PASSED test_x.py::test_a[1-2]`)."""
    return {test: word for word, test in _STATUS.findall(text)}


def resolved(fail_to_pass: Sequence[str], pass_to_pass: Sequence[str], status: Mapping[str, str]) -> bool:
    return all(status.get(test) in _PASSING for test in [*fail_to_pass, *pass_to_pass])


def _fraction(tests: Sequence[str], status: Mapping[str, str]) -> float:
    return sum(status.get(t) in _PASSING for t in tests) / len(tests) if tests else 1.0


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    status = parse_pytest_report(Path(sys.argv[2]).read_text(errors="replace"))
    f2p, p2p = config["FAIL_TO_PASS"], config["PASS_TO_PASS"]
    reward = float(resolved(f2p, p2p, status))
    out = Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    scores = {
        "reward": reward,
        "fail_to_pass": _fraction(f2p, status),
        "pass_to_pass": _fraction(p2p, status),
    }
    (out / "reward.json").write_text(json.dumps(scores))
    print(json.dumps(scores))


if __name__ == "__main__":
    main()
