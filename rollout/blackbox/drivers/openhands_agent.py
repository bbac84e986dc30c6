"""Driver of OpenHands (PyPI `openhands-sdk` + `openhands-tools`, unchanged Agent, LLM and
Conversation): the model is the episode's proxy URL through LiteLLM, and the agent's terminal and
file-editor actions run in the episode's sandbox through the gateway (`_stacx_openhands`), never
on this host. Limits come from the task: `max_turns` is the conversation's max iterations,
`step_timeout_s` each command's timeout. Options: `llm` (extra `openhands.sdk.LLM` fields, e.g.
`native_tool_calling`, `disable_stop_word`), `stuck_detection` (default false)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from _stacx_episode import GatewayShell, load_spec, write_result
from _stacx_openhands import FILE_EDITOR, TERMINAL, GatewayWorkspace
from openhands.sdk import LLM, Agent, Conversation
from openhands.sdk.tool import Tool


def build_llm(spec: dict[str, Any]) -> LLM:
    options = spec.get("options") or {}
    fields: dict[str, Any] = {
        "model": f"openai/{spec['model_name']}",
        "base_url": spec["model_base_url"],
        "api_key": spec["api_key"],
        "temperature": spec["temperature"],
        "max_output_tokens": spec["max_new_tokens"],
        "native_tool_calling": False,  # tools in the prompt as text: the proxy keeps exact tokens
        # No `</function` stop word: the model's own end of turn closes a call, so a call in
        # OpenHands' canonical form comes back verbatim and continues token-exactly.
        "disable_stop_word": True,
        "num_retries": 1,
        "timeout": int(spec["step_timeout_s"]) + 60,
        "usage_id": "agent",
    }
    return LLM(**{**fields, **(options.get("llm") or {})})


def run(spec: dict[str, Any]) -> dict[str, Any]:
    options = spec.get("options") or {}
    with tempfile.TemporaryDirectory(prefix="stacx-openhands-") as scratch:
        workspace = GatewayWorkspace.open(GatewayShell(spec), scratch)
        agent = Agent(llm=build_llm(spec), tools=[Tool(name=TERMINAL), Tool(name=FILE_EDITOR)])
        conversation = Conversation(
            agent=agent,
            workspace=workspace,
            max_iteration_per_run=int(spec["max_turns"]),
            stuck_detection=bool(options.get("stuck_detection", False)),
            visualizer=None,
        )
        try:
            conversation.send_message(spec["instruction"])
            conversation.run()
            state = conversation.state
            status = str(getattr(state.execution_status, "value", state.execution_status))
            num_events = len(state.events)
        finally:
            conversation.close()
    return {
        "exit_status": status,
        "num_events": num_events,
        "num_commands": workspace.num_commands,
        "sandbox_dir": workspace.sandbox_dir,
    }


def main() -> None:
    os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")
    spec = load_spec()
    write_result(spec, run(spec))


if __name__ == "__main__":
    main()
