"""The suites' own math checkers, as lm-eval ships them, on shared cases: run in lm-eval's side
venv (its Minerva checker needs antlr4 4.11; ours has 4.13 for math-verify).

    python lm_eval_reference.py < cases.json > verdicts.json

Input: {"gsm8k": [[response, answer field]], "math": [[response, solution]],
"minervamath": [[response, solution]], "aime2024": [[response, integer]],
"is_equiv": [[a, b]], "normalize": [text], "strip": [text]}; output: the same keys, one 0/1
verdict per case (`normalize`: Minerva's normalised text; `strip`: MATH's `strip_string`, or
null where it raises).
"""

from __future__ import annotations

import json
import sys

from lm_eval.api.metrics import exact_match_hf_evaluate
from lm_eval.filters.extraction import RegexFilter
from lm_eval.tasks.aime import utils as aime
from lm_eval.tasks.hendrycks_math import utils as hendrycks
from lm_eval.tasks.minerva_math import utils as minerva

GSM8K_FLEXIBLE = r"(-?[$0-9.,]{2,})|(-?[0-9]+)"  # lm-eval's gsm8k.yaml, flexible-extract
GSM8K_IGNORED = [",", "\\$", "(?s).*#### ", "\\.$"]  # its exact_match regexes_to_ignore


def boxed(text: str) -> str | None:
    last = hendrycks.last_boxed_only_string(text)
    return None if last is None else hendrycks.remove_boxed(last)


def gsm8k(response: str, answer: str) -> int:
    extracted = boxed(response) or ""
    picked = RegexFilter(GSM8K_FLEXIBLE, group_select=-1).apply([[extracted]], [{}])
    prediction = list(picked)[0][0]
    score = exact_match_hf_evaluate([prediction], [answer], regexes_to_ignore=GSM8K_IGNORED,
                                    ignore_case=True)
    return int(score["exact_match"])


def hendrycks_math(response: str, solution: str) -> int:
    return int(hendrycks.is_equiv(boxed(response), boxed(solution)))


def minerva_math(response: str, solution: str) -> int:
    got = minerva.normalize_final_answer(boxed(response) or "")
    want = minerva.normalize_final_answer(boxed(solution) or "")
    return int(minerva.is_equiv(got, want))


def aime2024(response: str, answer: int) -> int:
    return int(aime.process_results({"Answer": answer}, [response])["exact_match"])


def strip(text: str) -> str | None:
    try:
        return str(hendrycks.strip_string(text))
    except Exception:  # MATH's is_equiv then compares the raw strings
        return None


def main() -> None:
    cases = json.load(sys.stdin)
    checks = {"gsm8k": gsm8k, "math": hendrycks_math, "minervamath": minerva_math,
              "aime2024": aime2024, "is_equiv": lambda a, b: int(hendrycks.is_equiv(a, b)),
              "normalize": minerva.normalize_final_answer, "strip": strip}
    json.dump({name: [check(*case) for case in cases.get(name, [])] for name, check in checks.items()},
              sys.stdout)


if __name__ == "__main__":
    main()
