"""The math suites' own answer checkers, one reward each, applied to the episode's answer (the
last `\\boxed{}`, `\\fbox{}`, `\\boxed X` or `<answer>`, as `stacx.rollout.scaffolds.extract_answer`
finds it):

- `gsm8k_answer`: GSM8K's final number: the last number of the answer and of the reference,
  commas, `$` and a trailing `.` dropped, compared as strings (lm-eval's `gsm8k` flexible-extract
  and `exact_match`; `18.0` is not `18`, as in GSM8K's own `is_correct`);
- `hendrycks_math_answer`: MATH's `is_equiv` (Hendrycks et al. 2021): both strings normalised by
  `strip_string` (`\\dfrac` -> `\\frac`, `\\left`/`\\right`, units after `\\text{ `, `\\$`, `\\%`,
  `0.5` -> `\\frac{1}{2}`, `a/b` -> `\\frac{a}{b}`, ...) and compared;
- `minerva_answer`: Minerva's `normalize_final_answer` (Lewkowycz et al. 2022, appendix D, as
  lm-eval 0.4.13 ships it) on both, equal strings or a sympy difference that simplifies to 0;
- `aime_answer`: AIME's integer: the answer, normalised as MATH's, must be an integer equal to
  the reference (`033` is 33).

`math_equivalent` (`stacx.rollout.rewards`, math-verify) is the alternative for every suite
(`stacx bench run --grader math-verify`). An unparseable answer scores 0, never raises.
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Mapping
from typing import Any

from stacx.rollout.rewards import REWARDS
from stacx.rollout.scaffolds import extract_answer

__all__ = [
    "SYMPY_TIMEOUT_S",
    "aime_answer",
    "aime_equal",
    "gsm8k_answer",
    "gsm8k_final_number",
    "hendrycks_is_equiv",
    "hendrycks_math_answer",
    "minerva_answer",
    "minerva_equal",
    "normalize_final_answer",
    "strip_string",
]

_ORIGIN = "builtin (stacx.infra.benchmarks.math_grading)"


def _answer_text(answer: str) -> str:
    """The answer itself: a marked answer inside it (`<answer>\\boxed{5}</answer>`) unwrapped."""
    inner = extract_answer(answer)
    return inner if inner is not None else answer.strip()


def _graded(answer: str | None, data: Mapping[str, Any], equal: Any) -> dict[str, float]:
    if answer is None or "answer" not in data:
        return {"reward": 0.0, "answered": 0.0}
    try:
        correct = bool(equal(_answer_text(answer), str(data["answer"])))
    except Exception:  # untrusted model output: whatever the checker makes of it scores 0
        correct = False
    return {"reward": float(correct), "answered": 1.0}


# -- GSM8K --------------------------------------------------------------------------------------

_GSM8K_NUMBER = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_GSM8K_IGNORED = (re.compile(","), re.compile(r"\$"), re.compile(r"(?s).*#### "), re.compile(r"\.$"))


def _gsm8k_clean(text: str) -> str:
    for pattern in _GSM8K_IGNORED:
        text = pattern.sub("", text)
    return text.lower()


def gsm8k_final_number(text: str) -> str | None:
    """The last number in `text` as GSM8K compares it (commas, `$`, a trailing `.` dropped)."""
    matches = _GSM8K_NUMBER.findall(text)
    if not matches:
        return None
    last = next((group for group in matches[-1] if group), "")
    return _gsm8k_clean(last.strip())


def gsm8k_equal(answer: str, gold: str) -> bool:
    """GSM8K's rule: the answer's final number equals the reference's, as strings."""
    got = gsm8k_final_number(answer)
    return got is not None and got == _gsm8k_clean(gold.strip())


@REWARDS.register("gsm8k_answer", origin=_ORIGIN)
def gsm8k_answer(answer: str | None, data: Mapping[str, Any]) -> dict[str, float]:
    """1.0 when the answer's final number is GSM8K's reference number."""
    return _graded(answer, data, gsm8k_equal)


# -- MATH (Hendrycks et al.) --------------------------------------------------------------------


def _fix_fracs(string: str) -> str:
    parts = string.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part[0] == "{":  # an empty rest raises IndexError, as MATH's own function does
            out += part
            continue
        if len(part) < 2:
            return string
        a, b, rest = part[0], part[1], part[2:]
        out += f"{{{a}}}{{{b}}}{rest}" if b != "{" else f"{{{a}}}{b}{rest}"
    return out


def _fix_a_slash_b(string: str) -> str:
    parts = string.split("/")
    if len(parts) != 2:
        return string
    a, b = int(parts[0]), int(parts[1])  # not integers: ValueError, as MATH's own function
    return f"\\frac{{{a}}}{{{b}}}" if string == f"{a}/{b}" else string


def _remove_right_units(string: str) -> str:
    if "\\text{ " not in string:
        return string
    parts = string.split("\\text{ ")
    if len(parts) != 2:
        raise ValueError("more than one `\\text{ ` unit")  # MATH's own check fails the same way
    return parts[0]


def _fix_sqrt(string: str) -> str:
    parts = string.split("\\sqrt")
    out = parts[0]
    for part in parts[1:]:
        out += "\\sqrt" + (part if part[0] == "{" else f"{{{part[0]}}}{part[1:]}")
    return out


def strip_string(string: str) -> str:
    """MATH's answer normalisation (`strip_string` of the MATH release), step by step."""
    for before, after in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"),
                          ("dfrac", "frac"), ("\\left", ""), ("\\right", ""), ("^{\\circ}", ""),
                          ("^\\circ", ""), ("\\$", "")):
        string = string.replace(before, after)
    string = _remove_right_units(string)
    string = string.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not string:
        return string
    if string[0] == ".":
        string = "0" + string
    sides = string.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        string = sides[1]
    string = _fix_fracs(_fix_sqrt(string).replace(" ", ""))
    if string == "0.5":
        string = "\\frac{1}{2}"
    return _fix_a_slash_b(string)


def hendrycks_is_equiv(answer: str, gold: str) -> bool:
    """MATH's `is_equiv`: equal after `strip_string` (the raw strings when that fails on one:
    `a/b` with non-integers, two `\\text{ ` units, a trailing `\\sqrt`)."""
    try:
        return strip_string(answer) == strip_string(gold)
    except (ValueError, IndexError):
        return answer == gold


@REWARDS.register("hendrycks_math_answer", origin=_ORIGIN)
def hendrycks_math_answer(answer: str | None, data: Mapping[str, Any]) -> dict[str, float]:
    """1.0 when MATH's `is_equiv` holds between the answer and the reference."""
    return _graded(answer, data, hendrycks_is_equiv)


# -- Minerva (Lewkowycz et al. 2022) ------------------------------------------------------------

SUBSTITUTIONS = [("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""),
                 ("mbox", "text"), (",\\text{and}", ","), ("\\text{and}", ","),
                 ("\\text{m}", "\\text{}")]
REMOVED_EXPRESSIONS = [
    "square", "ways", "integers", "dollars", "mph", "inches", "ft", "hours", "km", "units",
    "\\ldots", "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm",
    "pounds", "meters", "meals", "edges", "students", "childrentickets", "multiples",
    "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}",
    r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots",
]


def _remove_units(answer: str) -> str:
    for expr in REMOVED_EXPRESSIONS:  # unit words while spaces still delimit them
        if expr.isalpha():
            answer = re.sub(rf"(?<!\\)\b{expr}\b", "", answer)
    for before, after in SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        if expr.isalpha():  # glued units, outside LaTeX command names (`\left` keeps its `ft`)
            segments = re.split(r"(\\[a-zA-Z]+)", answer)
            segments[::2] = [s.replace(expr, "") for s in segments[::2]]
            answer = "".join(segments)
        else:
            answer = answer.replace(expr, "")
    return answer


def normalize_final_answer(final_answer: str) -> str:
    """Minerva's normalisation of a final answer (appendix D, with lm-eval 0.4.13's fixes)."""
    answer = _remove_units(final_answer.split("=")[-1])
    for pattern, keep in ((r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$"), (r"(\\text\{)(.*?)(\})", "\\2"),
                          (r"(\\textbf\{)(.*?)(\})", "\\2"), (r"(\\overline\{)(.*?)(\})", "\\2"),
                          (r"(\\boxed\{)(.*)(\})", "\\2"), (r"(frac)([^{])(.)", "frac{\\2}{\\3}"),
                          (r"(sqrt)(\[[^\]]*\])(\w)", "\\1\\2{\\3}"),
                          (r"(sqrt)(?!\[)([^{])", "sqrt{\\2}")):
        answer = re.sub(pattern, keep, answer)
    answer = answer.replace("$", "")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+", answer):
        answer = answer.replace(",", "")
    return answer


SYMPY_TIMEOUT_S = 5.0
"""Minerva's checker gives sympy 5 s per comparison (`9^{9^{9^9}}` would run for ever)."""


def _sympy_equal(got: str, want: str) -> bool:
    import sympy
    from latex2sympy2_extended import latex2sympy

    return bool(sympy.simplify(latex2sympy(got) - latex2sympy(want)) == 0)


def _within_time_limit(got: str, want: str) -> bool:
    """`_sympy_equal` stopped after SYMPY_TIMEOUT_S by SIGALRM, as Minerva's checker does; only
    the main thread can set it, so elsewhere the strings alone decide."""
    if threading.current_thread() is not threading.main_thread():
        return False

    def _stop(signum: int, frame: Any) -> None:
        raise TimeoutError(f"sympy took over {SYMPY_TIMEOUT_S:g} s")

    previous = signal.signal(signal.SIGALRM, _stop)
    signal.setitimer(signal.ITIMER_REAL, SYMPY_TIMEOUT_S)
    try:
        return _sympy_equal(got, want)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def minerva_equal(answer: str, gold: str) -> bool:
    """Minerva's rule: the normalised strings are equal, or their sympy difference simplifies
    to 0 within 5 s (LaTeX parsed with latex2sympy2_extended, the parser math-verify ships)."""
    got, want = normalize_final_answer(answer), normalize_final_answer(gold)
    if got and got == want:
        return True
    if not got or not want:
        return False
    try:
        return _within_time_limit(got, want)
    except Exception:  # an answer sympy cannot read, subtract or finish with is not equal
        return False


@REWARDS.register("minerva_answer", origin=_ORIGIN)
def minerva_answer(answer: str | None, data: Mapping[str, Any]) -> dict[str, float]:
    """1.0 when Minerva's normalised answer equals the normalised reference."""
    return _graded(answer, data, minerva_equal)


# -- AIME ---------------------------------------------------------------------------------------

_INTEGER = re.compile(r"[+-]?\d+")


def aime_equal(answer: str, gold: str) -> bool:
    """AIME's rule: the answer is an integer (after MATH's normalisation) equal to the reference."""
    try:
        got = strip_string(answer)
    except (ValueError, IndexError):
        return False
    want = gold.strip()
    if not _INTEGER.fullmatch(got) or not _INTEGER.fullmatch(want):
        return False
    return int(got) == int(want)


@REWARDS.register("aime_answer", origin=_ORIGIN)
def aime_answer(answer: str | None, data: Mapping[str, Any]) -> dict[str, float]:
    """1.0 when the answer is the reference integer."""
    return _graded(answer, data, aime_equal)
