"""OpenHands (PyPI `openhands-sdk` + `openhands-tools`) as a black-box scaffold: `scaffold: openhands`.

The SDK needs Python >= 3.12, so it gets its own interpreter. Its terminal and file-editor tools
run in the episode's sandbox: the driver hands the agent a workspace of ours over the gateway."""

from __future__ import annotations

from dataclasses import dataclass, field

from stacx.rollout.blackbox.adapter import ExternalScaffold, register

__all__ = ["OpenHands"]


@register("openhands")
@dataclass(kw_only=True, slots=True)
class OpenHands(ExternalScaffold):
    requirements: tuple[str, ...] = ("openhands-sdk==1.58.2", "openhands-tools==1.58.2")
    python: str = "3.12"
    driver: str = "openhands_agent.py"
    env: dict[str, str] = field(
        default_factory=lambda: {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "OPENHANDS_SUPPRESS_BANNER": "1"}
    )
