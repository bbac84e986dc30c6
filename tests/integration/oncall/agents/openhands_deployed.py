"""A deployed OpenHands agent (openhands-sdk's own Agent, LLM, Conversation, default terminal and
file_editor tools on its own machine's workspace) whose model is the agent proxy. Runs in the
OpenHands venv: argv = proxy base URL (…/v1), model name, workspace dir, regex, max iterations."""

from __future__ import annotations

import sys

from openhands.sdk import LLM, Agent, Conversation
from openhands.sdk.tool import Tool
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.terminal import TerminalTool


def main() -> None:
    base_url, model, workspace, regex, iterations = sys.argv[1:6]
    llm = LLM(
        model=f"openai/{model}",
        base_url=base_url,
        api_key="deployed",
        native_tool_calling=False,
        disable_stop_word=True,
        max_output_tokens=256,
        num_retries=0,
        litellm_extra_body={"regex": regex},
        usage_id="agent",
    )
    tools = [
        Tool(name=TerminalTool.name, params={"terminal_type": "subprocess"}),
        Tool(name=FileEditorTool.name),
    ]
    conversation = Conversation(
        agent=Agent(llm=llm, tools=tools),
        workspace=workspace,
        max_iteration_per_run=int(iterations),
        stuck_detection=False,
        visualizer=None,
    )
    conversation.send_message("Write the word on-call to the file note.txt.")
    conversation.run()
    conversation.close()


if __name__ == "__main__":
    main()
