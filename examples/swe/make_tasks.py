"""Write the SWE tasks in miniature: Harbor task directories over a real repository snapshot.

    .venv/bin/python examples/swe/make_tasks.py [OUT]    # writes OUT/train/ and OUT/heldout/

The tasks are generated, not kept in git (each carries a copy of the snapshot): `run.py` writes them
under examples/swe/ when they are missing, tests into a folder of their own (`write_tasks`).

The repository is `inflection` 0.5.1 exactly as its PyPI sdist ships it (snapshot/, MIT licence;
sha256 of inflection-0.5.1.tar.gz: 1a29730d366e996aaacffb2f1f1cb9593dc38e2ddd30c91250c6dde09ea9b417).
Each task plants one bug (a one-line change, as SWE-smith does) and writes an issue about it:

- `environment/repo/` is the buggy repository (copied to /app): its own tests include failing ones;
- `solution/solve.sh` is the gold patch (the line restored);
- `tests/` grade as SWE-bench grades: the test files are reset to the snapshot's and the test
  patch (`test.patch`: a hidden test added to test_inflection.py) is applied, pytest runs with
  `-rA`, and the task is resolved when every FAIL_TO_PASS and every PASS_TO_PASS test passes
  (`grade.py`, which also writes the two fractions to /logs/verifier/reward.json).

FAIL_TO_PASS (fail on the buggy repository, pass with the gold patch) and PASS_TO_PASS (pass on
both) are computed here by running pytest on both, and every task is validated the way SWE-bench
validates instances: the gold patch resolves it, the empty patch does not.
"""

from __future__ import annotations

import difflib
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "grading"))
from grade import parse_pytest_report, resolved  # noqa: E402  (the graders' own rule, run in the sandbox)

SNAPSHOT = HERE / "snapshot" / "inflection-0.5.1"
MODULE = "inflection/__init__.py"
TESTS = "test_inflection.py"
WORKDIR = "/app"
IMAGE = "stacx/sandbox:bookworm"


@dataclass(frozen=True, slots=True)
class Bug:
    name: str
    good: str
    """A line of inflection/__init__.py (exactly once in it)."""
    bad: str
    """What the bug makes of it."""
    issue: str
    hidden_test: str
    """A test function the test patch adds to test_inflection.py."""


BUGS = (
    Bug(
        "ordinal-teens",
        "    if number % 100 in (11, 12, 13):",
        "    if number % 100 in (11, 12):",
        "`inflection.ordinalize(13)` returns '13rd'; it should be '13th' (like 11th and 12th).",
        "def test_ordinal_of_thirteens():\n    assert inflection.ordinalize(13) == '13th'\n"
        "    assert inflection.ordinalize(113) == '113th'\n",
    ),
    Bug(
        "dasherize",
        "    return word.replace('_', '-')",
        "    return word.replace('_', '')",
        "`inflection.dasherize('puni_puni')` returns 'punipuni' instead of 'puni-puni'.",
        "def test_dasherize_keeps_every_word():\n    assert inflection.dasherize('a_b_c') == 'a-b-c'\n",
    ),
    Bug(
        "humanize-id",
        '    word = re.sub(r"_id$", "", word)',
        '    word = re.sub(r"_ids$", "", word)',
        "`inflection.humanize('author_id')` returns 'Author id'; "
        "the '_id' suffix should be dropped: 'Author'.",
        "def test_humanize_drops_id_suffix():\n    assert inflection.humanize('employee_id') == 'Employee'\n",
    ),
    Bug(
        "parameterize-separator",
        "def parameterize(string: str, separator: str = '-') -> str:",
        "def parameterize(string: str, separator: str = '_') -> str:",
        "`inflection.parameterize('Donald E. Knuth')` gives 'donald_e_knuth'; the default separator "
        "should be a dash: 'donald-e-knuth'.",
        "def test_parameterize_default_separator():\n"
        "    assert inflection.parameterize('Hello World') == 'hello-world'\n",
    ),
    Bug(
        "underscore-dashes",
        '    word = word.replace("-", "_")',
        '    word = word.replace("-", "-")',
        "`inflection.underscore('puni-puni')` returns 'puni-puni'; dashes should become underscores.",
        "def test_underscore_turns_dashes_into_underscores():\n"
        "    assert inflection.underscore('a-b') == 'a_b'\n",
    ),
    Bug(
        "tableize-plural",
        "    return pluralize(underscore(word))",
        "    return underscore(word)",
        "`inflection.tableize('RawScaledScorer')` returns 'raw_scaled_scorer'; table names are plural: "
        "'raw_scaled_scorers'.",
        "def test_tableize_pluralizes():\n    assert inflection.tableize('Person') == 'people'\n",
    ),
    Bug(
        "camelize-lower",
        "        return string[0].lower() + camelize(string)[1:]",
        "        return string[0] + camelize(string)[1:]",
        "`inflection.camelize('Capital_city', False)` returns 'CapitalCity'; with "
        "uppercase_first_letter=False the first letter must be lower case: 'capitalCity'.",
        "def test_camelize_lower_first_letter():\n"
        "    assert inflection.camelize('Device_type', False) == 'deviceType'\n",
    ),
    Bug(
        "parameterize-collapse",
        "        string = re.sub(r'%s{2,}' % re_sep, separator, string)",
        "        string = re.sub(r'%s{3,}' % re_sep, separator, string)",
        "`inflection.parameterize('Hello- World')` keeps a double dash ('hello--world'); runs of the "
        "separator should collapse to one: 'hello-world'.",
        "def test_parameterize_collapses_separators():\n"
        "    assert inflection.parameterize('a- b') == 'a-b'\n",
    ),
)
HELDOUT = ("humanize-id", "camelize-lower", "parameterize-collapse")
"""Tasks no policy trains on."""


def instruction(bug: Bug) -> str:
    return (
        f"The Python repository at {WORKDIR} (the `inflection` library) has a bug:\n\n{bug.issue}\n\n"
        f"Fix the library's code in {WORKDIR}/{MODULE}. Its tests are in {WORKDIR}/{TESTS}.\n"
    )


def _planted(bug: Bug) -> str:
    source = (SNAPSHOT / MODULE).read_text()
    if source.count(bug.good + "\n") != 1:
        raise SystemExit(f"bug {bug.name}: {bug.good!r} is not exactly once in {MODULE}")
    return source.replace(bug.good + "\n", bug.bad + "\n")


def _patched_tests(bug: Bug) -> str:
    return (SNAPSHOT / TESTS).read_text().rstrip("\n") + "\n\n\n" + bug.hidden_test


def _test_patch(bug: Bug) -> str:
    before = (SNAPSHOT / TESTS).read_text().splitlines(keepends=True)
    after = _patched_tests(bug).splitlines(keepends=True)
    return "".join(difflib.unified_diff(before, after, f"a/{TESTS}", f"b/{TESTS}"))


def _statuses(module: str, tests: str) -> dict[str, str]:
    """pytest -rA statuses of `tests` against `module`, run in a scratch copy."""
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        shutil.copytree(SNAPSHOT, repo, dirs_exist_ok=True)
        (repo / MODULE).write_text(module)
        (repo / TESTS).write_text(tests)
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-rA", "-q", "-p", "no:cacheprovider", TESTS],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=300,
        )
    return parse_pytest_report(out.stdout)


def lists(bug: Bug) -> tuple[list[str], list[str]]:
    """(FAIL_TO_PASS, PASS_TO_PASS), validated: the gold patch resolves, the empty one does not."""
    tests = _patched_tests(bug)
    buggy, gold = _statuses(_planted(bug), tests), _statuses((SNAPSHOT / MODULE).read_text(), tests)
    f2p = sorted(t for t, s in gold.items() if s == "PASSED" and buggy.get(t) != "PASSED")
    p2p = sorted(t for t, s in gold.items() if s == "PASSED" and buggy.get(t) == "PASSED")
    hidden = bug.hidden_test.split("(")[0].removeprefix("def ")
    if not any(hidden in t for t in f2p):
        raise SystemExit(f"bug {bug.name}: the hidden test {hidden} does not fail on the buggy code")
    if not resolved(f2p, p2p, gold) or resolved(f2p, p2p, buggy):
        raise SystemExit(f"bug {bug.name}: the gold patch must resolve it and the empty patch must not")
    return f2p, p2p


def _task_toml(bug: Bug) -> str:
    return f"""schema_version = "1.1"

[task]
name = "stacx/swe-inflection-{bug.name}"
description = "Fix a planted bug in the inflection library (SWE-bench-style grading)."

[metadata]
difficulty = "easy"
category = "swe"
repo = "inflection==0.5.1 (PyPI sdist)"

[verifier]
timeout_sec = 180.0

[agent]
timeout_sec = 600.0

[environment]
cpus = 1
memory_mb = 512
network_mode = "no-network"
"""


def _solve_sh(bug: Bug) -> str:
    args = json.dumps([f"{WORKDIR}/{MODULE}", bug.bad + "\n", bug.good + "\n"])
    return (
        "#!/bin/bash\n# The gold patch: the planted line restored.\n"
        f"python3 - <<'EOF'\nimport json, pathlib\npath, bad, good = json.loads({args!r})\n"
        "p = pathlib.Path(path)\np.write_text(p.read_text().replace(bad, good, 1))\nEOF\n"
    )


TEST_SH = f"""#!/bin/bash
# SWE-bench grading: reset the test files, apply the test patch, run pytest -rA, apply the rule.
mkdir -p /logs/verifier
cd {WORKDIR}
cp /tests/{TESTS} {WORKDIR}/{TESTS}   # the snapshot's test file with the test patch applied
uvx --with pytest==8.4.1 pytest -rA -p no:cacheprovider {TESTS} > /logs/verifier/pytest.log 2>&1
python3 /tests/grade.py /tests/config.json /logs/verifier/pytest.log /logs/verifier
"""


def write_task(root: Path, bug: Bug) -> None:
    f2p, p2p = lists(bug)
    task = root / f"inflection-{bug.name}"
    repo = task / "environment" / "repo"
    shutil.copytree(SNAPSHOT, repo)
    (repo / MODULE).write_text(_planted(bug))
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {IMAGE}\nCOPY repo/ {WORKDIR}/\nWORKDIR {WORKDIR}\n"
    )
    (task / "solution").mkdir()
    (task / "tests").mkdir()
    (task / "task.toml").write_text(_task_toml(bug))
    (task / "instruction.md").write_text(instruction(bug))
    (task / "solution" / "solve.sh").write_text(_solve_sh(bug))
    (task / "tests" / "test.sh").write_text(TEST_SH)
    (task / "tests" / TESTS).write_text(_patched_tests(bug))
    (task / "tests" / "test.patch").write_text(_test_patch(bug))
    shutil.copy(HERE / "grading" / "grade.py", task / "tests" / "grade.py")
    config = {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "repo": "inflection==0.5.1", "bug": bug.name}
    (task / "tests" / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    for script in (task / "tests" / "test.sh", task / "solution" / "solve.sh"):
        script.chmod(0o755)


def write_tasks(out: Path) -> Path:
    """Every task under `out/train` and `out/heldout` (rewritten), each validated; `out`."""
    unknown = set(HELDOUT) - {b.name for b in BUGS}
    if unknown:
        raise SystemExit(f"HELDOUT names unknown bugs {sorted(unknown)}")
    for folder in ("train", "heldout"):
        shutil.rmtree(out / folder, ignore_errors=True)
        (out / folder).mkdir(parents=True)
    for bug in BUGS:
        write_task(out / ("heldout" if bug.name in HELDOUT else "train"), bug)
        print(f"{bug.name}: written and validated (gold resolves, empty patch does not)")
    return out


def main() -> None:
    write_tasks(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)


if __name__ == "__main__":
    main()
