"""`HeldOutEvaluator`: a candidate's success on held-out tasks, through a staging server.

The candidate's exported weights are loaded into a staging inference server (SGLang API:
`/update_weights_from_disk`), never into the serving fleet; each task (one JSONL line with
OpenAI `messages` and optional `tools`) is sent to its `/v1/chat/completions`, and a scorer
(a plug-in: `module:function`, `path/file.py:function`, an entry point in `stacx.scorers`;
called as `score(task, message) -> float`) says
whether the answer succeeded (score >= 1). The probe counts answers that hold a `<tool_call>`
block the server could not parse as a call: a malformed tool call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from stacx.schemas.plugins import PluginError, Registry, accepts
from stacx.trainer.errors import ConfigError, TrainerError
from stacx.trainer.oncall.gate import EvalReport

__all__ = ["SCORERS", "HeldOutEvaluator", "load_scorer"]

Scorer = Callable[[dict[str, Any], dict[str, Any]], float]


def _check_scorer(fn: Any) -> str | None:
    return accepts(fn, {}, {})


SCORERS: Registry[Scorer] = Registry("scorers", what="scorer", check=_check_scorer)
"""Held-out scorers `score(task, message) -> float`: a registered name, `package.module:function`,
`path/to/file.py:function`, or an entry point in `stacx.scorers`."""


def load_scorer(spec: str) -> Scorer:
    """The scorer `spec` names; `ConfigError` with one line naming `evaluation.scorer` otherwise."""
    try:
        return SCORERS.resolve(spec)
    except PluginError as exc:
        raise ConfigError(f"evaluation.scorer: {exc}") from exc


class HeldOutEvaluator:
    """Evaluates weight directories on a fixed held-out task set (module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        staging_url: str = ""
        """Inference server used only for evaluation (the command starts one when empty)."""
        tasks_path: str = ""
        """JSONL of held-out tasks: `messages`, optional `tools`, anything the scorer needs."""
        scorer: str = ""
        """`module:function` or `file.py:function`: score(task, assistant message) -> float."""
        max_tokens: int = 64
        """Completion limit per task."""
        temperature: float = 0.0
        """0: greedy, so two versions are compared on the same decisions."""
        seed: int | None = None
        """With sampling: task i samples with seed + i, so two versions see the same random draws."""
        concurrency: int = 32
        """Tasks in flight at once (the server batches them)."""
        timeout_s: float = 300.0
        """Timeout of one HTTP call."""

        def __post_init__(self) -> None:
            if not self.tasks_path or not self.scorer:
                raise ConfigError(
                    "evaluation.tasks_path and evaluation.scorer are required: the gate "
                    "needs a held-out task set and a way to score it"
                )

    def __init__(self, config: Config) -> None:
        self.config = config
        self.tasks = [
            json.loads(line) for line in Path(config.tasks_path).read_text().splitlines() if line.strip()
        ]
        if not self.tasks:
            raise ConfigError(f"evaluation.tasks_path {config.tasks_path} holds no task")
        self.scorer = load_scorer(config.scorer)

    def evaluate(self, model_path: str, version: int) -> EvalReport:
        """Load `model_path` on the staging server, run every task, score them."""
        return asyncio.run(self._evaluate(model_path, version))

    async def _evaluate(self, model_path: str, version: int) -> EvalReport:
        cfg = self.config
        async with httpx.AsyncClient(base_url=cfg.staging_url, timeout=cfg.timeout_s) as http:
            loaded = await http.post(
                "/update_weights_from_disk",
                json={"model_path": model_path, "weight_version": f"eval-{version}"},
            )
            if loaded.status_code != 200 or not loaded.json().get("success", False):
                raise TrainerError(f"staging server refused {model_path}: {loaded.text[:300]}")
            limit = asyncio.Semaphore(cfg.concurrency)
            answers = await asyncio.gather(*(self._ask(http, limit, t, i) for i, t in enumerate(self.tasks)))
        scores = [
            float(self.scorer(task, message)) for task, message in zip(self.tasks, answers, strict=True)
        ]
        malformed = sum(1 for m in answers if "<tool_call>" in (m.get("content") or ""))
        n = len(self.tasks)
        return EvalReport(
            version=version,
            success_rate=sum(s >= 1.0 for s in scores) / n,
            probe_rate=malformed / n,
            num_tasks=n,
            details={"mean_score": sum(scores) / n},
        )

    async def _ask(
        self, http: httpx.AsyncClient, limit: asyncio.Semaphore, task: dict[str, Any], index: int
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "messages": task["messages"],
            "max_tokens": self.config.max_tokens,
            "temperature": self.config.temperature,
        }
        if self.config.seed is not None:
            body["seed"] = self.config.seed + index
        if task.get("tools"):
            body["tools"] = task["tools"]
        async with limit:
            response = await http.post("/v1/chat/completions", json=body)
        if response.status_code != 200:
            raise TrainerError(f"staging server answered {response.status_code}: {response.text[:300]}")
        message: dict[str, Any] = response.json()["choices"][0]["message"]
        return message
