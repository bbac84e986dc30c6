"""A process that only talks to an inference server (client, router, error types) does not pull in
the engine's torch: `stacx.rollout.inference` imports its names on first use."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _modules_after(code: str) -> list[str]:
    probe = f"import sys\n{code}\nprint(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return list(ast.literal_eval(done.stdout.strip().splitlines()[-1]))


def test_the_client_router_and_errors_import_without_torch() -> None:
    assert (
        _modules_after(
            "from stacx.rollout.inference import InferenceClient, InferenceError, SamplingParams\n"
            "from stacx.rollout.inference.router import RouterConfig, router_command\n"
            "from stacx.infra.cli import build_parser; build_parser()"
        )
        == []
    )


def test_the_engine_still_comes_by_its_public_name() -> None:
    assert "torch" in _modules_after("from stacx.rollout.inference import BatchingEngine")
