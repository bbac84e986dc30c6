"""Fixtures of the inference tests (unit and integration): tiny local models made once per session,
one CPU thread. Imported by their conftest.py files."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from stacx.rollout.inference import InferenceServer


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread; idle-spinning pools stall on a busy machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stacx.rollout.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-seed0"), seed=0)


@pytest.fixture(scope="session")
def other_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture, different weights (seed 1): what a training step publishes."""
    from stacx.rollout.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-seed1"), seed=1)


@contextlib.contextmanager
def serve_tiny(model_dir: Path, **config: Any) -> Iterator[InferenceServer]:
    """A started built-in server on `model_dir` (any free port, one torch thread), stopped after."""
    import torch

    from stacx.rollout.inference import InferenceServer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the engine thread keeps the setting it was built with
    server = InferenceServer(InferenceServer.Config(model_path=str(model_dir), port=0, **config))
    server.start()
    try:
        yield server
    finally:
        server.stop()
        torch.set_num_threads(threads)


CALC_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "evaluate arithmetic",
            "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}},
        },
    }
]
"""One OpenAI function tool, as an agent declares it."""
CALC_CALL = '<tool_call>\n{"name": "calc", "arguments": {"expr":"1+1"}}\n</tool_call>'
"""What a model emits when it writes JSON its own way (no space after the colon)."""


def tool_markers(server: InferenceServer) -> dict[str, int]:
    """A logit bias favouring the one-token tool tags, so the grammar picks them over their bytes."""
    tok = server.state.tokenizer
    return {str(tok.convert_tokens_to_ids(t)): 100 for t in ("<tool_call>", "</tool_call>")}
