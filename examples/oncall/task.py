"""The on-call demo's task: a support agent that must call the right tool.

Users ask for the weather or the time in a city, in several phrasings. The agent (built with the
OpenAI Agents SDK, served by the tiny policy through the STACX proxy) has two tools; the SDK
returns the first tool's output as the answer (`stop_on_first_tool`). A user is satisfied only
when the answer comes from the right tool. The warm-started policy often answers in prose,
calls the wrong tool, or writes a malformed call; delayed user feedback teaches it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

INSTRUCTIONS = "Answer with one tool call."

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "properties": {},
                "title": f"{name}_args",
                "type": "object",
                "additionalProperties": False,
                "required": [],
            },
            "strict": True,
        },
    }
    for name, description in (("get_weather", "Weather now."), ("get_time", "Time now."))
]
"""Exactly what the Agents SDK sends for the two `function_tool`s of `demo.py`."""

TEMPLATES = {
    "get_weather": [
        "What's the weather in {city}?",
        "Is it raining in {city}?",
        "Do I need an umbrella in {city}?",
        "How warm is it in {city}?",
    ],
    "get_time": [
        "What time is it in {city}?",
        "What's the local time in {city}?",
        "Is it morning in {city}?",
        "What hour is it in {city}?",
    ],
}
TRAIN_CITIES = [
    "Paris",
    "Lima",
    "Oslo",
    "Cairo",
    "Tokyo",
    "Quito",
    "Dakar",
    "Perth",
    "Riga",
    "Seoul",
    "Hanoi",
    "Minsk",
    "Accra",
    "Sofia",
    "Kyiv",
    "Bern",
    "Doha",
    "Male",
]
HELDOUT_CITIES = ["Rome", "Baku", "Lagos", "Delhi", "Turin", "Nice", "Graz", "Oran"]


@dataclass(frozen=True, slots=True)
class Question:
    text: str
    tool: str
    """The tool whose answer satisfies the user."""


def sample_question(rng: random.Random, cities: list[str] = TRAIN_CITIES) -> Question:
    tool = rng.choice(sorted(TEMPLATES))
    return Question(rng.choice(TEMPLATES[tool]).format(city=rng.choice(cities)), tool)


def tool_output(tool: str) -> str:
    """What a tool returns (the user recognises it)."""
    return {"get_weather": "Sunny, 21 C.", "get_time": "It is 14:05."}[tool]


def satisfied(question: Question, answer: str) -> bool:
    return answer.strip() == tool_output(question.tool)


# -- warm start (SFT demonstrations) -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Mixture:
    """Shares of the warm-start demonstrations (the rest: the right tool)."""

    wrong_tool: float = 0.2
    prose: float = 0.3
    malformed: float = 0.15


def call_text(tool: str) -> str:
    """A call without arguments (the tools take none): fewer tokens to get right."""
    return f'<tool_call>{{"name": "{tool}"}}</tool_call>'


def demonstration(question: Question, rng: random.Random, mix: Mixture) -> str:
    """The assistant's answer in one warm-start demonstration."""
    roll = rng.random()
    if roll < mix.prose:
        return rng.choice(["I am not sure.", "Please check a website.", "I think it is fine."])
    if roll < mix.prose + mix.malformed:
        return f'<tool_call>{{"name": "{question.tool}"</tool_call>'
    if roll < mix.prose + mix.malformed + mix.wrong_tool:
        other = next(t for t in sorted(TEMPLATES) if t != question.tool)
        return call_text(other)
    return call_text(question.tool)


def messages(question: Question) -> list[dict[str, str]]:
    """What the Agents SDK sends for one question (system instructions, then the user)."""
    return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": question.text}]


# -- held-out set and scorer (the promotion gate) ---------------------------------------------


def heldout_tasks(num: int = 64, seed: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    tasks = []
    for _ in range(num):
        q = sample_question(rng, HELDOUT_CITIES)
        tasks.append({"messages": messages(q), "tools": TOOLS, "tool": q.tool})
    return tasks


def score(task: dict[str, Any], message: dict[str, Any]) -> float:
    """1 when the first tool call names the task's tool (the SDK would return its output)."""
    calls = message.get("tool_calls") or []
    return 1.0 if calls and calls[0]["function"]["name"] == task["tool"] else 0.0


if __name__ == "__main__":
    print(json.dumps(heldout_tasks(2), indent=1))


CHAT_TEMPLATE = (
    "{% set ns = namespace(tools='') %}"
    "{% for tool in (tools or []) %}"
    "{% set f = tool.function if tool.function is defined else tool %}"
    "{% set ns.tools = ns.tools ~ ' ' ~ f.name %}"
    "{% endfor %}"
    "{% set ns.rest = messages %}"
    "{% if messages and messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}"
    "{% if ns.tools %}{{ '\\n' }}Tools:{{ ns.tools }}{% endif %}<|im_end|>\n"
    "{% set ns.rest = messages[1:] %}"
    "{% elif ns.tools %}"
    "<|im_start|>system\nTools:{{ ns.tools }}<|im_end|>\n"
    "{% endif %}"
    "{% for m in ns.rest %}"
    "{% if m.role == 'assistant' %}"
    "<|im_start|>assistant\n{{ m.content or '' }}"
    "{% for c in (m.tool_calls or []) %}"
    '<tool_call>\n{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments }}}\n</tool_call>'
    "{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A compact ChatML template: tools are listed by name (the model learns what they do), so a
prompt is ~60 tokens instead of ~850 with the full tool schemas: 10x cheaper to train on CPU."""


def install_chat_template(model_dir: str) -> None:
    """Make `CHAT_TEMPLATE` the template of a tiny-model directory (the proxy, the servers and the
    trainer's exports all read it from there)."""
    from pathlib import Path

    root = Path(model_dir)
    (root / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    config_path = root / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2))
