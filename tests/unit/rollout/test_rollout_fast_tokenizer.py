"""FastTokenizer (tokenizers + jinja2, no transformers, no torch) against transformers itself, and
the rollout service's start-up path without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stacx.rollout.models import make_tiny_model
from stacx.rollout.protocols import Message
from stacx.rollout.tokens import FastTokenizer, HFTokenizer, load_tokenizer, model_vocab_size

REPO = Path(__file__).resolve().parents[3]

CONVERSATIONS: list[list[Message]] = [
    [{"role": "user", "content": "What is 37*48+19?"}],
    [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<tool_call>\nprint(2+2)\n</tool_call>"},
        {"role": "tool", "content": "4\n"},
        {"role": "assistant", "content": "The answer is 4."},
        {"role": "user", "content": 'ünïcödé, "quotes" & <tags>\n\n  spaces  '},
    ],
    [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "run", "arguments": {"code": "1"}}}],
        },
    ],
]

# A template that uses what transformers' environment adds or relies on: the special-token
# variables, trimmed blocks, loop controls, its tojson, raise_exception and {% generation %}.
RICH_TEMPLATE = """{{ bos_token if bos_token is defined else '' }}
{% for message in messages %}
    {% if message.role not in ['system', 'user', 'assistant', 'tool'] %}
        {{ raise_exception('unknown role ' + message.role) }}
    {% endif %}
    {% if loop.index > 8 %}{% break %}{% endif %}
<|im_start|>{{ message.role }}
    {% if message.role == 'assistant' %}
{% generation %}{{ message.content }}{% endgeneration %}
    {% else %}
{{ message.content }}
    {% endif %}
    {% if message.tool_calls is defined %}{{ message.tool_calls | tojson }}{% endif %}
{{ eos_token }}
{% endfor %}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def _with_template(model_dir: Path, folder: Path, template: str, **special: str) -> Path:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), **special)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(str(folder))
    return folder


def _transformers_render(folder: Path, messages: list[Message], add_generation_prompt: bool) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return str(
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    )


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_the_chat_template_renders_byte_identical_to_transformers(
    model_dir: Path, conversation: int, add_generation_prompt: bool
) -> None:
    fast = FastTokenizer.from_dir(model_dir)
    assert fast is not None
    messages = CONVERSATIONS[conversation]
    expected = _transformers_render(model_dir, messages, add_generation_prompt)
    assert fast.render_chat(messages, add_generation_prompt=add_generation_prompt) == expected


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_a_template_using_transformers_extensions_renders_the_same(
    model_dir: Path, tmp_path: Path, add_generation_prompt: bool
) -> None:
    folder = _with_template(model_dir, tmp_path / "rich", RICH_TEMPLATE, bos_token="<|endoftext|>")
    fast = FastTokenizer.from_dir(folder)
    assert fast is not None and fast.special_tokens["bos_token"] == "<|endoftext|>"
    for messages in CONVERSATIONS:
        expected = _transformers_render(folder, messages, add_generation_prompt)
        assert fast.render_chat(messages, add_generation_prompt=add_generation_prompt) == expected


def test_raise_exception_in_a_template_is_a_template_error(model_dir: Path, tmp_path: Path) -> None:
    import jinja2

    fast = FastTokenizer.from_dir(_with_template(model_dir, tmp_path / "rich", RICH_TEMPLATE))
    assert fast is not None
    with pytest.raises(jinja2.TemplateError, match="unknown role robot"):
        fast.render_chat([{"role": "robot", "content": "x"}], add_generation_prompt=True)


def test_ids_text_and_end_of_turn_tokens_match_the_transformers_tokenizer(model_dir: Path) -> None:
    fast, hf = FastTokenizer.from_dir(model_dir), HFTokenizer(str(model_dir))
    assert fast is not None
    text = hf.render_chat(CONVERSATIONS[1], add_generation_prompt=True) + "<tool_call>1+1</tool_call>"
    assert fast.encode(text) == hf.encode(text)
    assert fast.decode(fast.encode(text)) == text
    assert fast.eos_token_ids == hf.eos_token_ids and fast.eos_token_ids


def test_directories_it_cannot_read_exactly_go_to_transformers(model_dir: Path, tmp_path: Path) -> None:
    assert isinstance(load_tokenizer(model_dir), FastTokenizer)
    split = _with_template(model_dir, tmp_path / "split", RICH_TEMPLATE)
    (split / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    assert FastTokenizer.from_dir(split) is None
    assert isinstance(load_tokenizer(split), HFTokenizer)
    untemplated = _with_template(model_dir, tmp_path / "untemplated", "")
    (untemplated / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((untemplated / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (untemplated / "tokenizer_config.json").write_text(json.dumps(config))
    assert FastTokenizer.from_dir(untemplated) is None


def test_the_vocab_size_is_read_as_transformers_reads_it(model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoConfig

    assert model_vocab_size(model_dir) == AutoConfig.from_pretrained(str(model_dir)).vocab_size
    nested = tmp_path / "nested"
    nested.mkdir()
    config = json.loads((model_dir / "config.json").read_text())
    (nested / "config.json").write_text(
        json.dumps({"model_type": "llava", "vocab_size": 5, "text_config": {**config, "vocab_size": 300}})
    )
    assert model_vocab_size(nested) == 300  # the text model's, through AutoConfig


def test_the_rollout_service_starts_without_importing_torch(model_dir: Path, tmp_path: Path) -> None:
    """`stacx rollout`'s path: the CLI, the config checks, the manager with the quickstart's
    evaluator (ReTool scaffold, plug-in reward) and the tokenizer; torch must stay out."""
    (tmp_path / "tasks.jsonl").write_text(
        json.dumps(
            {
                "task_id": "t0",
                "task_type": "arithmetic_tool",
                "prompt": "What is 1+1?",
                "data": {"answer": "2", "expression": "1+1"},
            }
        )
        + "\n"
    )
    (tmp_path / "rollout.yaml").write_text(
        textwrap.dedent(
            f"""
            data: {{path: {tmp_path / "tasks.jsonl"}, samples_per_task: 2}}
            inference: {{url: "http://127.0.0.1:9", tokenizer: "{model_dir}"}}
            sandbox: {{url: "http://127.0.0.1:9", image: "stacx/sandbox:bookworm"}}
            kafka: {{publish: false, follow_weights: false}}
            manager:
              evaluators:
                arithmetic_tool:
                  scaffold: retool
                  scaffold_options: {{system_prompt: ""}}
                  reward: quickstart.arithmetic:score
                  max_turns: 3
                  max_tokens: 256
                  max_new_tokens: 48
            """
        )
    )
    probe = textwrap.dedent(
        f"""
        import asyncio, sys
        from stacx.infra.cli import build_parser
        from stacx.infra.commands.rollout import load_rollout_config
        from stacx.rollout.service import open_manager

        build_parser()
        config = load_rollout_config({str(tmp_path / "rollout.yaml")!r})

        async def main():
            async with open_manager(config) as manager:
                assert manager is not None

        asyncio.run(main())
        print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "examples")])}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
