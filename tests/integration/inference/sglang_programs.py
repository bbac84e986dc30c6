"""SGLang frontend programs, run by SGLang's own package in its side venv against a server URL
(argv[1]); prints one JSON object. Driven by test_inference_sglang_frontend.py."""

from __future__ import annotations

import json
import sys

import sglang as sgl

PATTERN = r"[0-9]{3}-(red|blue)"
CHOICES = ["yes", "no", "maybe"]


@sgl.function
def stop_program(s):
    s += "Q: 1+1=" + sgl.gen("answer", max_tokens=16, stop="\n", temperature=0)


@sgl.function
def regex_program(s, seed):
    s += f"Code {seed}: " + sgl.gen("code", max_tokens=16, regex=PATTERN, temperature=1.0)


@sgl.function
def select_program(s):
    s += "Is it? " + sgl.select("choice", choices=CHOICES)


@sgl.function
def fork_program(s):
    s += "Start. "
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Branch {i}: " + sgl.gen("branch", max_tokens=6, temperature=0)
    forks.join()
    s["branches"] = [f["branch"] for f in forks]


def main() -> None:
    endpoint = sgl.RuntimeEndpoint(sys.argv[1])
    sgl.set_default_backend(endpoint)
    out: dict[str, object] = {"model": endpoint.get_model_name()}
    try:
        out["server_info"] = endpoint.get_server_info()
    except RuntimeError as exc:  # the frontend's answer to a non-200: reported, the programs go on
        out["server_info"] = {"frontend_error": str(exc)}
    state = stop_program.run()
    out["stop"] = {"answer": state["answer"], "meta": state.get_meta_info("answer")}
    out["regex"] = [regex_program.run(seed=i)["code"] for i in range(4)]
    state = select_program.run()
    out["select"] = {"choice": state["choice"], "meta": state.get_meta_info("choice")}
    state = fork_program.run()
    out["fork"] = {"branches": state["branches"], "text": state.text()}
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
