"""Test-command outputs of SWE-bench instances, one per grading case the issue lists, in the
formats the repositories' own runners print: django's `runtests.py --verbosity 2`, sympy's
`bin/test -C --verbose`, pytest `-rA` (plain, with ids holding spaces, option paths, ANSI colour,
the old `id STATUS` layout), matplotlib's renamed ids, seaborn's. Each case names the verdict
SWE-bench gives it, worked out by hand from the harness's rules."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LogCase:
    name: str
    repo: str
    log_parser: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    output: str
    """What the test command prints (between the harness's start and end markers)."""
    exit_code: int
    resolved: bool
    """SWE-bench's verdict, by hand."""
    markers: bool = True
    """False: the script dies before the start marker (the test patch did not apply)."""


DJ = "django/django"
F2P_DJ = ["test_new (validators.tests.TestValidators.test_new)"]
P2P_DJ = ["test_old (validators.tests.TestValidators.test_old)",
          "test_other (validators.tests.TestValidators.test_other)"]
DJ_HEAD = ("Testing against Django installed in '/testbed/django'\nImporting application validators\n"
           "Found 3 test(s).\nSkipping setup of unused database(s): default, other.\n"
           "System check identified no issues (0 silenced).\n")
DJ_TAIL = "\n----------------------------------------------------------------------\nRan 3 tests in 0.012s\n"

SY = "sympy/sympy"
SY_HEAD = ("============================= test process starts ==============================\n"
           "executable:         /opt/miniconda3/envs/testbed/bin/python  (3.9.19-final-0) [CPython]\n"
           "architecture:       64-bit\ncache:              no\nground types:       python \n"
           "numpy:              None\nrandom seed:        50863296\n"
           "hash randomization: on (PYTHONHASHSEED=1)\n\n"
           "sympy/core/tests/test_numbers.py[3] \n")

PT = "pytest-dev/pytest"
PT_HEAD = ("============================= test session starts ==============================\n"
           "platform linux -- Python 3.9.19, pytest-7.4.0, pluggy-1.3.0\nrootdir: /testbed\n"
           "collected 3 items\n\ntesting/test_x.py ..F                                        [100%]\n\n"
           "=========================== short test summary info ============================\n")
F2P_PT = ["testing/test_x.py::test_new"]
P2P_PT = ["testing/test_x.py::test_old", "testing/test_x.py::test_other"]

AP = "astropy/astropy"
F2P_AP = ["astropy/io/ascii/tests/test_qdp.py::test_roundtrip[lowercase header]"]
P2P_AP = ["astropy/io/ascii/tests/test_qdp.py::test_read_example",
          "astropy/io/ascii/tests/test_qdp.py::test_get_tables_from_qdp_file[a b c]"]
RQ = "psf/requests"
ESC = "\x1b"
PAD = " " * 40
"""sympy pads a result to the right margin; the file's verdict goes on a line of its own."""
RIGHT = " " * 70


def _dj(lines: str) -> str:
    return DJ_HEAD + lines + DJ_TAIL


def _pt(lines: str, summary: str) -> str:
    return PT_HEAD + lines + summary


CASES: list[LogCase] = [
    # django: runtests.py --verbosity 2, its own parser
    LogCase("django all pass", DJ, "parse_log_django", F2P_DJ, P2P_DJ, _dj(
        "test_new (validators.tests.TestValidators.test_new) ... ok\n"
        "test_old (validators.tests.TestValidators.test_old) ... ok\n"
        "test_other (validators.tests.TestValidators.test_other) ... ok\n") + "\nOK\n", 0, True),
    LogCase("django fail to pass still fails", DJ, "parse_log_django", F2P_DJ, P2P_DJ, _dj(
        "test_new (validators.tests.TestValidators.test_new) ... FAIL\n"
        "test_old (validators.tests.TestValidators.test_old) ... ok\n"
        "test_other (validators.tests.TestValidators.test_other) ... ok\n\n"
        "======================================================================\n"
        "FAIL: test_new (validators.tests.TestValidators.test_new)\nAssertionError: 1 != 2\n")
        + "\nFAILED (failures=1)\n", 1, False),
    LogCase("django error", DJ, "parse_log_django", F2P_DJ, P2P_DJ, _dj(
        "test_new (validators.tests.TestValidators.test_new) ... ERROR\n"
        "test_old (validators.tests.TestValidators.test_old) ... ok\n"
        "test_other (validators.tests.TestValidators.test_other) ... ok\n"
        "ERROR: test_new (validators.tests.TestValidators.test_new)\nTypeError: bad\n")
        + "\nFAILED (errors=1)\n", 1, False),
    LogCase("django regression in pass to pass", DJ, "parse_log_django", F2P_DJ, P2P_DJ, _dj(
        "test_new (validators.tests.TestValidators.test_new) ... ok\n"
        "test_old (validators.tests.TestValidators.test_old) ... FAIL\n"
        "test_other (validators.tests.TestValidators.test_other) ... ok\n")
        + "\nFAILED (failures=1)\n", 1, False),
    LogCase("django skipped pass to pass is maintained", DJ, "parse_log_django", F2P_DJ, P2P_DJ, _dj(
        "test_new (validators.tests.TestValidators.test_new) ... ok\n"
        "test_old (validators.tests.TestValidators.test_old) ... skipped 'Database has no feature'\n"
        "test_other (validators.tests.TestValidators.test_other) ... ok\n")
        + "\nOK (skipped=1)\n", 0, True),
    LogCase("django ok after the test's own output", DJ, "parse_log_django", F2P_DJ, P2P_DJ, _dj(
        "test_new (validators.tests.TestValidators.test_new) ... Internal Server Error: /raises/\n"
        "Traceback (most recent call last):\n  File \"x.py\", line 1\nok\n"
        "test_old (validators.tests.TestValidators.test_old) ... ok\n"
        "test_other (validators.tests.TestValidators.test_other) ... ok\n") + "\nOK\n", 0, True),
    LogCase("django test missing from the run", DJ, "parse_log_django", F2P_DJ, P2P_DJ, _dj(
        "test_old (validators.tests.TestValidators.test_old) ... ok\n"
        "test_other (validators.tests.TestValidators.test_other) ... ok\n") + "\nOK\n", 0, False),
    LogCase("django expected failure counts as pass", DJ, "parse_log_django", F2P_DJ, P2P_DJ[:1], _dj(
        "test_new (validators.tests.TestValidators.test_new) ... ok\n"
        "test_old (validators.tests.TestValidators.test_old) ... expected failure\n") + "\nOK\n", 0, False),
    LogCase("django runner crashes before any test", DJ, "parse_log_django", F2P_DJ, P2P_DJ,
            "Traceback (most recent call last):\n  File \"./tests/runtests.py\", line 27\n"
            "ImportError: cannot import name 'x'\n", 1, False),
    # sympy: bin/test -C --verbose, its own parser
    LogCase("sympy all ok", SY, "parse_log_sympy", ["test_round"], ["test_int", "test_float"], SY_HEAD +
            "test_int ok\ntest_float ok\ntest_round" + PAD + "ok\n" + RIGHT + "[OK]\n\n"
            "================== tests finished: 3 passed, in 0.52 seconds ===================\n", 0, True),
    LogCase("sympy F", SY, "parse_log_sympy", ["test_round"], ["test_int"], SY_HEAD +
            "test_int ok\ntest_round" + PAD + "F\n" + RIGHT + "[FAIL]\n\n"
            "________________________________________________________________________________\n"
            "___________ sympy/core/tests/test_numbers.py:test_round ___________\n"
            "AssertionError\n\n== tests finished: 1 passed, 1 failed, in 0.5 seconds ==\n"
            "DO *NOT* COMMIT!\n", 1, False),
    LogCase("sympy E", SY, "parse_log_sympy", ["test_round"], ["test_int"], SY_HEAD +
            "test_int ok\ntest_round" + PAD + "E\n" + RIGHT + "[FAIL]\n\n"
            "== tests finished: 1 passed, 1 exceptions, in 0.5 seconds ==\n", 1, False),
    LogCase("sympy test absent", SY, "parse_log_sympy", ["test_round"], ["test_int"], SY_HEAD +
            "test_int" + PAD + "ok\n" + RIGHT + "[OK]\n\n"
            "== tests finished: 1 passed, in 0.5 seconds ==\n", 0, False),
    LogCase("sympy regression", SY, "parse_log_sympy", ["test_round"], ["test_int"], SY_HEAD +
            "test_int F\ntest_round" + PAD + "ok\n" + RIGHT + "[FAIL]\n\n"
            "== tests finished: 1 passed, 1 failed, in 0.5 seconds ==\n", 1, False),
    LogCase("sympy expected failure and skip lines", SY, "parse_log_sympy", ["test_round"], ["test_int"],
            SY_HEAD + "test_int ok\ntest_slow s\ntest_known f\ntest_round" + PAD + "ok\n" + RIGHT + "[OK]\n\n"
            "== tests finished: 2 passed, 1 skipped, 1 expected to fail, in 0.5 seconds ==\n", 0, True),
    # pytest -rA: the short summary
    LogCase("pytest all pass", PT, "parse_log_pytest", F2P_PT, P2P_PT, _pt("",
            "PASSED testing/test_x.py::test_old\nPASSED testing/test_x.py::test_other\n"
            "PASSED testing/test_x.py::test_new\n============ 3 passed in 0.10s ============\n"), 0, True),
    LogCase("pytest failed with a message", PT, "parse_log_pytest", F2P_PT, P2P_PT, _pt("",
            "PASSED testing/test_x.py::test_old\nPASSED testing/test_x.py::test_other\n"
            "FAILED testing/test_x.py::test_new - AssertionError: assert 1 == 2\n"
            "====== 1 failed, 2 passed in 0.10s ======\n"), 1, False),
    LogCase("pytest error at setup", PT, "parse_log_pytest", F2P_PT, P2P_PT, _pt("",
            "PASSED testing/test_x.py::test_old\nPASSED testing/test_x.py::test_other\n"
            "ERROR testing/test_x.py::test_new - fixture 'tmp' not found\n====== 2 passed, 1 error ======\n"),
            1, False),
    LogCase("pytest skipped pass to pass is maintained", PT, "parse_log_pytest", F2P_PT, P2P_PT, _pt("",
            "PASSED testing/test_x.py::test_old\nSKIPPED testing/test_x.py::test_other\n"
            "PASSED testing/test_x.py::test_new\n====== 2 passed, 1 skipped ======\n"), 0, True),
    LogCase("pytest skipped fail to pass is no resolution", PT, "parse_log_pytest", F2P_PT, P2P_PT, _pt("",
            "PASSED testing/test_x.py::test_old\nPASSED testing/test_x.py::test_other\n"
            "SKIPPED testing/test_x.py::test_new\n====== 2 passed, 1 skipped ======\n"), 0, False),
    LogCase("pytest xfail counts as pass", PT, "parse_log_pytest", F2P_PT, P2P_PT, _pt("",
            "PASSED testing/test_x.py::test_old\nPASSED testing/test_x.py::test_other\n"
            "XFAIL testing/test_x.py::test_new - reason: known\n====== 2 passed, 1 xfailed ======\n"),
            0, True),
    LogCase("pytest skip summary with a count is no test", PT, "parse_log_pytest", F2P_PT, P2P_PT, _pt("",
            "PASSED testing/test_x.py::test_old\nPASSED testing/test_x.py::test_other\n"
            "PASSED testing/test_x.py::test_new\nSKIPPED [1] testing/test_y.py:12: needs numpy\n"
            "====== 3 passed, 1 skipped ======\n"), 0, True),
    LogCase("pytest conftest prints PASSED, tests exit 1", PT, "parse_log_pytest", F2P_PT, P2P_PT,
            "PASSED testing/test_x.py::test_old\nPASSED testing/test_x.py::test_other\n"
            "PASSED testing/test_x.py::test_new\n", 1, False),
    LogCase("pytest bare status line does not swallow the next line", PT, "parse_log_pytest", F2P_PT, P2P_PT,
            _pt("", "PASSED testing/test_x.py::test_old\nPASSED testing/test_x.py::test_other\nPASSED\n"
                "testing/test_x.py::test_new\n====== 3 passed ======\n"), 0, False),
    LogCase("pytest ANSI colour hides the status from the plain parser", PT, "parse_log_pytest", F2P_PT,
            P2P_PT, _pt("", f"{ESC}[32mPASSED{ESC}[0m testing/test_x.py::test_old\n"
                        f"{ESC}[32mPASSED{ESC}[0m testing/test_x.py::test_other\n"
                        f"{ESC}[32mPASSED{ESC}[0m testing/test_x.py::test_new\n"), 0, False),
    LogCase("pytest truncated parametrised id matches by prefix", PT, "parse_log_pytest",
            ["testing/test_x.py::test_grammar[log(photon"], P2P_PT, _pt("",
            "PASSED testing/test_x.py::test_old\nPASSED testing/test_x.py::test_other\n"
            "PASSED testing/test_x.py::test_grammar[log(photon)]\n====== 3 passed ======\n"), 0, True),
    LogCase("pytest partial resolution is not resolved", PT, "parse_log_pytest",
            [*F2P_PT, "testing/test_x.py::test_new2"], P2P_PT, _pt("",
            "PASSED testing/test_x.py::test_old\nPASSED testing/test_x.py::test_other\n"
            "PASSED testing/test_x.py::test_new\nFAILED testing/test_x.py::test_new2 - assert 0\n"),
            1, False),
    LogCase("pytest prints nothing", PT, "parse_log_pytest", F2P_PT, P2P_PT, "", 0,
            False),
    LogCase("flask plain pytest", "pallets/flask", "parse_log_flask", ["tests/test_basic.py::test_new"],
            ["tests/test_basic.py::test_old"], "PASSED tests/test_basic.py::test_old\n"
            "PASSED tests/test_basic.py::test_new\n====== 2 passed ======\n", 0, True),
    LogCase("xarray failure", "pydata/xarray", "parse_log_xarray", ["xarray/tests/test_a.py::test_new"],
            ["xarray/tests/test_a.py::test_old"], "PASSED xarray/tests/test_a.py::test_old\n"
            "FAILED xarray/tests/test_a.py::test_new - ValueError\n", 1, False),
    # astropy / scikit-learn / sphinx: full ids with spaces, ANSI stripped (pytest_v2)
    LogCase("astropy ids with spaces", AP, "parse_log_astropy", F2P_AP, P2P_AP,
            "PASSED astropy/io/ascii/tests/test_qdp.py::test_read_example\n"
            "PASSED astropy/io/ascii/tests/test_qdp.py::test_get_tables_from_qdp_file[a b c]\n"
            "PASSED astropy/io/ascii/tests/test_qdp.py::test_roundtrip[lowercase header]\n"
            "====== 3 passed ======\n", 0, True),
    LogCase("astropy id with spaces fails with a message", AP, "parse_log_astropy", F2P_AP, P2P_AP,
            "PASSED astropy/io/ascii/tests/test_qdp.py::test_read_example\n"
            "PASSED astropy/io/ascii/tests/test_qdp.py::test_get_tables_from_qdp_file[a b c]\n"
            "FAILED astropy/io/ascii/tests/test_qdp.py::test_roundtrip[lowercase header] - ValueError: x y\n",
            1, False),
    LogCase("scikit-learn ANSI colour is stripped", "scikit-learn/scikit-learn", "parse_log_scikit",
            ["sklearn/tests/test_a.py::test_new[param with space]"], ["sklearn/tests/test_a.py::test_old"],
            f"{ESC}[32mPASSED{ESC}[0m sklearn/tests/test_a.py::test_old\n"
            f"{ESC}[32mPASSED{ESC}[0m sklearn/tests/test_a.py::test_new[param with space]\n", 0, True),
    LogCase("sphinx old pytest layout id then status", "sphinx-doc/sphinx", "parse_log_sphinx",
            ["tests/test_build.py::test_new"], ["tests/test_build.py::test_old"],
            "tests/test_build.py::test_old PASSED\ntests/test_build.py::test_new PASSED\n", 0, True),
    LogCase("sphinx skipped fail to pass", "sphinx-doc/sphinx", "parse_log_sphinx",
            ["tests/test_build.py::test_new"], ["tests/test_build.py::test_old"],
            "PASSED tests/test_build.py::test_old\nSKIPPED tests/test_build.py::test_new\n", 0, False),
    # requests / pylint / pydicom: option-path ids
    LogCase("requests option path id", RQ, "parse_log_requests",
            ["test_requests.py::test_file[/file.txt]"], ["test_requests.py::RequestsTestCase::test_old"],
            "PASSED test_requests.py::RequestsTestCase::test_old\n"
            "PASSED test_requests.py::test_file[/tmp/pytest-of-root/pytest-0/file.txt]\n", 0, True),
    LogCase("requests option path id fails", RQ, "parse_log_requests",
            ["test_requests.py::test_file[/file.txt]"], ["test_requests.py::RequestsTestCase::test_old"],
            "PASSED test_requests.py::RequestsTestCase::test_old\n"
            "FAILED test_requests.py::test_file[/tmp/pytest-of-root/pytest-0/file.txt] - OSError\n",
            1, False),
    LogCase("pylint functional option id", "pylint-dev/pylint", "parse_log_pylint",
            ["tests/test_functional.py::test_functional[/recursion_error.py]"],
            ["tests/test_self.py::TestRunTC::test_version"],
            "PASSED tests/test_self.py::TestRunTC::test_version\n"
            "PASSED tests/test_functional.py::test_functional"
            "[/testbed/tests/functional/r/recursion_error.py]\n",
            0, True),
    LogCase("pydicom URL option keeps its double slash", "pydicom/pydicom", "parse_log_pydicom",
            ["pydicom/tests/test_a.py::test_url[//host/x]"], [],
            "PASSED pydicom/tests/test_a.py::test_url[//host/x]\n", 0, True),
    # matplotlib: the ids it renames
    LogCase("matplotlib MouseButton ids", "matplotlib/matplotlib", "parse_log_matplotlib",
            ["lib/matplotlib/tests/test_widgets.py::test_span_selector_drag[1]"],
            ["lib/matplotlib/tests/test_widgets.py::test_rectangle_selector"],
            "PASSED lib/matplotlib/tests/test_widgets.py::test_rectangle_selector\n"
            "PASSED lib/matplotlib/tests/test_widgets.py::test_span_selector_drag[MouseButton.LEFT]\n",
            0, True),
    LogCase("matplotlib skipped pass to pass", "matplotlib/matplotlib", "parse_log_matplotlib",
            ["lib/matplotlib/tests/test_axes.py::test_new"], ["lib/matplotlib/tests/test_axes.py::test_pdf"],
            "SKIPPED lib/matplotlib/tests/test_axes.py::test_pdf\n"
            "PASSED lib/matplotlib/tests/test_axes.py::test_new\n", 0, True),
    LogCase("seaborn", "mwaskom/seaborn", "parse_log_seaborn", ["tests/test_core.py::test_new"],
            ["tests/test_core.py::test_old"], "tests/test_core.py::test_old PASSED [ 50%]\n"
            "tests/test_core.py::test_new PASSED [100%]\n", 0, True),
    # the run itself
    LogCase("test patch does not apply: the script dies before the tests", PT, "parse_log_pytest", F2P_PT,
            P2P_PT, "PASSED testing/test_x.py::test_new\n", 0, False, markers=False),
]
