"""mini-swe-agent (PyPI `mini-swe-agent`) as a black-box scaffold: `scaffold: mini-swe-agent`."""

from __future__ import annotations

from dataclasses import dataclass, field

from stacx.rollout.blackbox.adapter import ExternalScaffold, register
from stacx.rollout.errors import ConfigError
from stacx.rollout.protocols import Message

__all__ = ["MiniSweAgent"]


@register("mini-swe-agent")
@dataclass(kw_only=True, slots=True)
class MiniSweAgent(ExternalScaffold):
    requirements: tuple[str, ...] = ("mini-swe-agent==2.4.6",)
    driver: str = "mini_swe_agent.py"
    env: dict[str, str] = field(default_factory=lambda: {"LITELLM_LOCAL_MODEL_COST_MAP": "True"})

    def first_messages(self, instruction: str) -> list[Message]:
        """System and task messages as its DefaultAgent renders them (jinja2, StrictUndefined).

        Only templates given in `scaffold_options.agent` are known here (the shipped ones live in
        the scaffold's own environment), and they may use `{{task}}` only."""
        from jinja2 import StrictUndefined, Template, UndefinedError

        agent = (self.options.get("agent") or {}) if isinstance(self.options, dict) else {}
        missing = [k for k in ("system_template", "instance_template") if not agent.get(k)]
        if missing:
            raise ConfigError(
                f"scaffold 'mini-swe-agent': set scaffold_options.agent.{' and '.join(missing)} "
                "to render its transcripts (the first call's messages)"
            )
        messages: list[Message] = []
        for role, key in (("system", "system_template"), ("user", "instance_template")):
            try:
                text = Template(str(agent[key]), undefined=StrictUndefined).render(task=instruction)
            except UndefinedError as exc:
                raise ConfigError(
                    f"scaffold 'mini-swe-agent': scaffold_options.agent.{key} uses {exc.message}; "
                    "templates of rendered transcripts may use {{task}} only"
                ) from exc
            messages.append({"role": role, "content": text})
        return messages
