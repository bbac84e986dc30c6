"""Driver of mini-swe-agent (its text-based DefaultAgent and litellm model, unchanged): the
model is the episode's proxy URL, and each bash action runs in the episode's sandbox through the
gateway. Options: `config` (a mini-swe-agent config name or path, default mini_textbased),
`agent` / `model` (overrides of those config sections)."""

from __future__ import annotations

import os
from typing import Any

import yaml
from _stacx_episode import GatewayShell, load_spec, write_result
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import get_config_path
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel


class GatewayEnvironment(LocalEnvironment):
    """mini-swe-agent's environment interface over the STACX sandbox gateway."""

    def __init__(self, shell: GatewayShell, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shell = shell

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        try:
            done = self.shell.run(
                action.get("command", ""), timeout_s=timeout or self.config.timeout, workdir=cwd or None
            )
            output = {
                "output": done["stdout"] + done["stderr"],
                "returncode": done["exit_code"],
                "exception_info": "the command timed out" if done.get("timed_out") else "",
            }
        except Exception as exc:  # noqa: BLE001 - the agent sees the failure as an observation
            output = {"output": "", "returncode": -1, "exception_info": f"{type(exc).__name__}: {exc}"}
        self._check_finished(output)
        return output


def main() -> None:
    spec = load_spec()
    options = spec.get("options") or {}
    config = yaml.safe_load(get_config_path(options.get("config", "mini_textbased")).read_text())
    agent_config = {**config.get("agent", {}), "step_limit": spec["max_turns"], **options.get("agent", {})}
    agent_config.pop("mode", None)
    model_config = {**config.get("model", {}), **options.get("model", {})}
    model_config["model_name"] = f"openai/{spec['model_name']}"
    model_config["cost_tracking"] = "ignore_errors"
    model_config["model_kwargs"] = {
        **model_config.get("model_kwargs", {}),
        "api_base": spec["model_base_url"],
        "api_key": spec["api_key"],
        "max_tokens": spec["max_new_tokens"],
        "temperature": spec["temperature"],
    }
    os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "2")
    env = GatewayEnvironment(
        GatewayShell(spec), **{**config.get("environment", {}), "timeout": int(spec["step_timeout_s"])}
    )
    agent = DefaultAgent(LitellmTextbasedModel(**model_config), env, **agent_config)
    info = agent.run(spec["instruction"])
    write_result(
        spec,
        {
            "exit_status": str(info.get("exit_status", "")),
            "num_steps": agent.n_calls,
            "submission": str(info.get("submission", ""))[:500],
        },
    )


if __name__ == "__main__":
    main()
