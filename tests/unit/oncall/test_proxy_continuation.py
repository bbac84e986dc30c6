"""Token-exact chat continuation: a session's next prompt starts with the ids it sampled, even
where re-tokenising the answer's text would give other ids."""

from __future__ import annotations

from pathlib import Path

from stacx.rollout.proxy.continuation import ChatContinuations


def _tokenizer(path: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _messages(*contents: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": role, "content": text} for role, text in contents]


def test_a_repeated_answer_continues_from_the_sampled_ids(tiny_model_dir: Path) -> None:
    tok = _tokenizer(tiny_model_dir)
    memory = ChatContinuations(tok)
    first = _messages(("system", "be brief"), ("user", "hi"))
    prompt = tok.apply_chat_template(first, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if isinstance(prompt, dict) else prompt)
    answer = "hellothere"
    # A random policy samples special tokens mid-answer; the client gets the text without them, so
    # re-rendering the answer would not give back the sampled ids.
    special = tok.convert_tokens_to_ids("<|im_start|>")
    end = tok.convert_tokens_to_ids("<|im_end|>")
    sampled = [
        *tok.encode("hello", add_special_tokens=False),
        special,
        *tok.encode("there", add_special_tokens=False),
        end,
    ]
    assert tok.decode(sampled, skip_special_tokens=True) == answer
    memory.remember("s", first, prompt, sampled, answer)
    second = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "and?"}]
    ids = memory.prompt_ids("s", second)
    assert ids is not None and ids[: len(prompt) + len(sampled)] == prompt + sampled
    rendered = tok.apply_chat_template(second, add_generation_prompt=True, tokenize=False)
    rest = rendered[rendered.index(answer) + len(answer) :].removeprefix("<|im_end|>")
    assert tok.decode(ids[len(prompt) + len(sampled) :]) == rest  # the template's tokens after the answer
    assert memory.num_continued == 1


def test_anything_else_is_rendered_as_usual(tiny_model_dir: Path) -> None:
    tok = _tokenizer(tiny_model_dir)
    memory = ChatContinuations(tok)
    first = _messages(("user", "hi"))
    memory.remember("s", first, [1, 2], [3], "yo")
    assert (
        memory.prompt_ids("other-session", [*first, *_messages(("assistant", "yo"), ("user", "x"))]) is None
    )
    assert memory.prompt_ids("s", [*first, *_messages(("assistant", "edited"), ("user", "x"))]) is None
    assert (
        memory.prompt_ids(
            "s", [*_messages(("user", "changed")), *_messages(("assistant", "yo"), ("user", "x"))]
        )
        is None
    )
    assert memory.prompt_ids("s", first) is None
