"""Terminus-2 (from the Harbor framework, PyPI `harbor`) as a black-box scaffold: `scaffold: terminus-2`.

Harbor needs Python >= 3.12, so it gets its own interpreter. Terminus-2 drives a tmux session, so
the task's image must have tmux (a task Dockerfile can `apt-get install tmux`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from stacx.rollout.blackbox.adapter import ExternalScaffold, register


@register("terminus-2")
@dataclass(kw_only=True, slots=True)
class Terminus2(ExternalScaffold):
    requirements: tuple[str, ...] = ("harbor==0.26.0",)
    python: str = "3.12"
    driver: str = "terminus2.py"
    env: dict[str, str] = field(default_factory=lambda: {"LITELLM_LOCAL_MODEL_COST_MAP": "True"})
