"""Driver of Terminus-2 (Harbor's terminal agent, unchanged): Harbor's `BaseEnvironment` is
implemented over the STACX gateway (`_stacx_harbor`), the model is
the episode's proxy URL through litellm. The task image needs tmux. Options: any Terminus-2
constructor argument (e.g. `parser_name`, `enable_summarize`)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from _stacx_episode import GatewayShell, load_spec, write_result
from _stacx_harbor import GatewayEnvironment
from harbor.agents.terminus_2 import Terminus2
from harbor.models.agent.context import AgentContext


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    options = {"record_terminal_session": False, "enable_summarize": False, **(spec.get("options") or {})}
    with tempfile.TemporaryDirectory(prefix="stacx-terminus2-") as tmp:
        env = GatewayEnvironment.for_session(GatewayShell(spec), Path(tmp), spec["episode_id"])
        agent = Terminus2(
            logs_dir=Path(tmp) / "agent",
            model_name=f"openai/{spec['model_name']}",
            api_base=spec["model_base_url"],
            max_turns=spec["max_turns"],
            temperature=spec["temperature"],
            model_info={"max_input_tokens": 32768, "max_output_tokens": spec["max_new_tokens"]},
            llm_call_kwargs={"max_tokens": spec["max_new_tokens"], "api_key": spec["api_key"]},
            **options,
        )
        await agent.setup(env)
        context = AgentContext()
        await agent.run(spec["instruction"], env, context)
    return {"exit_status": "finished", "num_input_tokens": context.n_input_tokens or 0}


def main() -> None:
    spec = load_spec()
    write_result(spec, asyncio.run(run(spec)))


if __name__ == "__main__":
    main()
