"""SGLang's own frontend (`sglang` from PyPI: `RuntimeEndpoint`, `gen` with stop and regex,
`select`, `fork`) runs programs against the built-in server.

SGLang's runtime pins CUDA wheels its frontend never imports, so the package is installed with
`--no-deps` (plus the few modules its import chain needs) into a side venv (infra/sidevenv.py),
built on first use. Its answers are checked against the server's own native API and against
Python's `re`, not against the frontend's say-so.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from inference_fixtures import serve_tiny

from stacx.infra.sidevenv import SideVenvError, ensure_side_venv
from stacx.rollout.inference import InferenceServer

SGLANG = "sglang==0.5.23"
FRONTEND_NEEDS = ["orjson", "pybase64", "msgspec", "pyzmq", "ipython"]
"""What `import sglang` pulls in besides what our venv has (torch, numpy, requests, aiohttp, ...)."""
PROGRAMS = Path(__file__).with_name("sglang_programs.py")
PATTERN = r"[0-9]{3}-(red|blue)"
CHOICES = ["yes", "no", "maybe"]


@pytest.fixture(scope="module")
def sglang_python() -> Path:
    try:
        python, _ = ensure_side_venv("sglang-frontend-0.5.23", FRONTEND_NEEDS, no_deps=[SGLANG])
    except SideVenvError as exc:
        pytest.fail(f"SGLang's frontend could not be installed: {exc}")
    return python


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[InferenceServer]:
    with serve_tiny(tiny_model_dir, weight_version="0", context_length=256) as srv:
        yield srv


@pytest.fixture(scope="module")
def results(sglang_python: Path, server: InferenceServer) -> dict[str, Any]:
    done = subprocess.run(
        [str(sglang_python), str(PROGRAMS), server.base_url], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"the SGLang programs failed:\n{done.stderr[-3000:]}"
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _greedy(server: InferenceServer, text: str, **sampling: Any) -> dict[str, Any]:
    body = {"text": text, "sampling_params": {"temperature": 0, **sampling}}
    response = httpx.post(f"{server.base_url}/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_gen_with_a_stop_string_matches_the_native_api(server: InferenceServer, results: dict) -> None:
    native = _greedy(server, "Q: 1+1=", max_new_tokens=16, stop="\n")
    assert results["stop"]["answer"] == native["text"]
    assert "\n" not in results["stop"]["answer"]
    assert results["stop"]["meta"]["weight_version"] == "0"


def test_gen_with_a_regex_is_constrained(results: dict) -> None:
    assert len(results["regex"]) == 4
    for code in results["regex"]:
        assert re.fullmatch(PATTERN, code), code


def test_select_picks_the_best_normalized_choice(results: dict) -> None:
    meta = results["select"]["meta"]
    scores = meta["normalized_prompt_logprobs"]
    assert len(scores) == len(CHOICES) and all(math.isfinite(s) for s in scores)
    assert results["select"]["choice"] == CHOICES[max(range(len(CHOICES)), key=scores.__getitem__)]
    assert all(len(per_choice) > 0 for per_choice in meta["input_token_logprobs"])


def test_fork_branches_equal_the_native_greedy_outputs(server: InferenceServer, results: dict) -> None:
    expected = [_greedy(server, f"Start. Branch {i}: ", max_new_tokens=6)["text"] for i in range(2)]
    assert results["fork"]["branches"] == expected


def test_server_and_model_info_answer_under_sglangs_current_names(
    server: InferenceServer, results: dict
) -> None:
    """`RuntimeEndpoint.get_server_info()` asks `/server_info`; SGLang's routes today are
    `/server_info` and `/model_info` (the `get_` names are its deprecated aliases)."""
    info = results["server_info"]
    assert "frontend_error" not in info, info["frontend_error"]
    assert info["weight_version"] == "0" and info["model_path"] == server.state.model_path
    assert isinstance(info["version"], str) and isinstance(info["internal_states"], list)
    assert results["model"] == server.state.model_path
    for path in ("/model_info", "/get_model_info"):
        model = httpx.get(f"{server.base_url}{path}", timeout=30).json()
        assert model["weight_version"] == "0" and model["model_path"] == server.state.model_path
