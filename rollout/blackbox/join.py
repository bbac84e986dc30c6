"""One episode's captured model calls -> one token sequence with its loss mask (prefix merge).

A scaffold that keeps appending to its chat history sends prompts that extend the previous
prompt + completion token for token; then every call joins: the first prompt is context (mask 0),
each completion is generated (mask 1, the server's logprobs), and the tokens between one
completion and the next call's prompt end (tool output, the next user message, template markers)
are context again. When a prompt does not extend what came before (the scaffold summarised or
edited its history), the joined sequence restarts at that call: the trajectory holds the last
unbroken run of calls, and `num_dropped_calls` says how many earlier calls it left out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stacx.rollout.tokens import TokenBuffer
from stacx.schemas.records import AgentInteraction, Turn, token_ids

__all__ = ["JoinedCalls", "external_metadata", "join_calls"]


@dataclass(slots=True)
class JoinedCalls:
    buffer: TokenBuffer = field(default_factory=TokenBuffer)
    turns: list[Turn] = field(default_factory=list)
    prompt_length: int = 0
    num_calls: int = 0
    num_dropped_calls: int = 0
    finish_reasons: list[str] = field(default_factory=list)


def _split(call: AgentInteraction) -> tuple[list[int], list[int], list[float]]:
    ids = [int(t) for t in call.token_ids]
    num_prompt = int(call.metadata.get("prompt_length", 0)) or list(call.loss_mask).index(1)
    lps = [float(x) for x in call.logprobs]
    return ids[:num_prompt], ids[num_prompt:], lps[num_prompt:]


def join_calls(
    calls: Sequence[AgentInteraction], decode: Callable[[list[int]], str] | None = None
) -> JoinedCalls:
    """Prefix-merge `calls` (in arrival order); `decode` gives context turns their text."""
    joined = JoinedCalls()
    for call in calls:
        prompt, completion, lps = _split(call)
        context = joined.buffer.ids
        if not context or prompt[: len(context)] != context:
            joined.num_dropped_calls += joined.num_calls
            joined.num_calls = 0
            joined.buffer, joined.turns, joined.finish_reasons = TokenBuffer(), [], []
            joined.prompt_length = len(prompt)
            new_part, role = prompt, "user"
        else:
            new_part, role = prompt[len(context) :], "tool"
        if new_part:
            joined.buffer.add_context(new_part)
            text = decode(new_part) if decode is not None else ""
            joined.turns.append(Turn(role=role, text=text, token_ids=token_ids(new_part)))
        joined.buffer.add_generated(completion, lps)
        joined.turns.append(
            Turn(
                role="assistant",
                text=call.response,
                token_ids=token_ids(completion),
                policy_version=int(call.policy_version),
                started_at_ms=int(call.created_at_ms),
            )
        )
        joined.num_calls += 1
        joined.finish_reasons.append(call.metadata.get("finish_reason", ""))
    return joined


def external_metadata(result: dict[str, object], joined: JoinedCalls) -> dict[str, str]:
    """Trajectory metadata of a black-box episode: the driver's result and the join's counts."""
    meta = {f"scaffold_{k}": str(v)[:200] for k, v in result.items() if isinstance(v, str | int | float)}
    meta["num_model_calls"] = str(joined.num_calls + joined.num_dropped_calls)
    meta["num_dropped_calls"] = str(joined.num_dropped_calls)
    return meta
