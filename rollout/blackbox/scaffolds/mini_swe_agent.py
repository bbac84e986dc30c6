"""mini-swe-agent (PyPI `mini-swe-agent`) as a black-box scaffold: `scaffold: mini-swe-agent`."""

from __future__ import annotations

from dataclasses import dataclass

from rollout.blackbox.adapter import ExternalScaffold, register


@register("mini-swe-agent")
@dataclass(kw_only=True, slots=True)
class MiniSweAgent(ExternalScaffold):
    requirements: tuple[str, ...] = ("mini-swe-agent==2.4.6",)
    driver: str = "mini_swe_agent.py"
