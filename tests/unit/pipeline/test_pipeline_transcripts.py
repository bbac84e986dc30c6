"""SFT transcripts of a black-box scaffold: rendered as its first model call, mixed by kind."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from stacx.infra.pipeline import load_spec, parse_spec
from stacx.infra.pipeline.config import SFTConfig, TranscriptsConfig
from stacx.infra.pipeline.errors import PipelineConfigError
from stacx.infra.pipeline.resolve import check_resolved, transcript_adapter
from stacx.infra.pipeline.sft import transcript_batches
from stacx.rollout.blackbox.adapter import build_external
from stacx.rollout.blackbox.transcripts import TranscriptRenderer
from stacx.rollout.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "scaffold_grpo" / "scaffold_grpo.yaml"
AGENT = {"system_template": "Use ```bash.", "instance_template": "Task: {{task}}"}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from stacx.rollout.models.tokenizer import make_tokenizer

    return make_tokenizer()


def test_mini_swe_agent_renders_its_first_call_from_the_templates() -> None:
    adapter = build_external("mini-swe-agent", {"agent": AGENT})
    assert adapter.first_messages("write x") == [
        {"role": "system", "content": "Use ```bash."},
        {"role": "user", "content": "Task: write x"},
    ]
    with pytest.raises(
        ConfigError, match=r"set scaffold_options.agent.system_template and instance_template"
    ):
        build_external("mini-swe-agent", {}).first_messages("write x")
    other = {"agent": {**AGENT, "instance_template": "{{task}} on {{system}}"}}
    with pytest.raises(
        ConfigError, match=r"instance_template uses 'system' is undefined; .* \{\{task\}\} only"
    ):
        build_external("mini-swe-agent", other).first_messages("write x")
    with pytest.raises(ConfigError, match="does not say what its first model call looks like"):
        build_external("terminus-2", {}).first_messages("write x")


def test_a_transcript_is_the_proxy_rendered_prompt_then_the_answer_and_end_of_turn(tokenizer: Any) -> None:
    from stacx.rollout.inference.openai_api import ChatCompletionRequest
    from stacx.rollout.proxy.render import PromptRenderer

    renderer = TranscriptRenderer(build_external("mini-swe-agent", {"agent": AGENT}), tokenizer)
    ids, mask = renderer.encode("write x\n", "```bash\ntouch x\n```")
    body = ChatCompletionRequest(
        messages=[
            {"role": "system", "content": "Use ```bash."},
            {"role": "user", "content": "Task: write x\n"},
        ]
    )
    prompt = PromptRenderer(tokenizer).chat(body).ids
    assert ids[: len(prompt)] == prompt and sum(mask[: len(prompt)]) == 0
    assert tokenizer.decode(ids[len(prompt) :]) == "```bash\ntouch x\n```<|im_end|>"
    assert mask[len(prompt) :] == [1] * (len(ids) - len(prompt))
    assert tokenizer.decode(prompt).endswith("Task: write x\n<|im_end|>\n<|im_start|>assistant\n")


def _rows() -> list[dict[str, str]]:
    rows = []
    for i in range(6):
        rows.append({"instruction": f"task {i}", "answer": f"good {i}", "kind": "expert"})
        rows.append({"instruction": f"task {i}", "answer": f"bad {i}", "kind": "novice"})
    return rows


def _encode(instruction: str, answer: str) -> tuple[list[int], list[int]]:
    prompt, completion = list(instruction.encode()), list(answer.encode())
    return prompt + completion, [0] * len(prompt) + [1] * len(completion)


def _expert_share(batch: Any) -> float:
    good = 0
    for offset, length, prompt_length in zip(batch.offsets, batch.lengths, batch.prompt_lengths, strict=True):
        answer = bytes(int(t) for t in batch.token_ids[offset + prompt_length : offset + length])
        good += answer.startswith(b"good")
    return good / len(batch.lengths)


def test_transcript_batches_mix_expert_and_novice_rows_by_phase() -> None:
    sft = SFTConfig(steps=40, skill_steps=20, batch_size=64, seed=3)
    config = TranscriptsConfig(path="t.jsonl", expert_fraction=0.0, skill_expert_fraction=1.0)
    batches = transcript_batches(_rows(), _encode, sft, config)
    assert len(batches) == 40 and all(len(b.lengths) == 64 for b in batches)
    assert [_expert_share(b) for b in batches] == [1.0] * 20 + [0.0] * 20
    first = batches[0]
    assert int(first.prompt_lengths[0]) == len("task 0") and int(first.loss_mask[: len("task 0")].sum()) == 0
    half = TranscriptsConfig(path="t.jsonl", expert_fraction=0.5, skill_expert_fraction=0.5)
    shares = [_expert_share(b) for b in transcript_batches(_rows(), _encode, sft, half)]
    assert 0.4 < sum(shares) / len(shares) < 0.6
    with pytest.raises(ValueError, match="needs expert and novice rows"):
        transcript_batches([r for r in _rows() if r["kind"] == "expert"], _encode, sft, config)


def test_transcripts_need_a_black_box_evaluator_and_readable_rows(tmp_path: Path) -> None:
    spec = load_spec(EXAMPLE)
    assert transcript_adapter(spec).name == "mini-swe-agent"
    tree = copy.deepcopy({
        "pipeline": spec.pipeline.model_dump(exclude_none=True),
        "rollout": spec.rollout, "assembler": spec.assembler, "trainer": spec.trainer,
    })  # fmt: skip
    tree["pipeline"]["tasks"]["harbor"] = str(EXAMPLE.parent / "train")
    tree["pipeline"]["tasks"]["heldout"] = str(EXAMPLE.parent / "heldout")
    tree["pipeline"]["transcripts"]["path"] = str(EXAMPLE.parent / "transcripts.jsonl")
    check_resolved(parse_spec(tree, source="f.yaml"))
    tree["rollout"]["manager"]["evaluators"]["default"]["scaffold_options"]["agent"].pop("system_template")
    with pytest.raises(PipelineConfigError) as info:
        check_resolved(parse_spec(tree, source="f.yaml"))
    assert "f.yaml: scaffold 'mini-swe-agent': set scaffold_options.agent.system_template" in str(info.value)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"instruction": "x", "answer": "y"}) + "\n")
    tree["pipeline"]["transcripts"]["path"] = str(bad)
    with pytest.raises(PipelineConfigError) as info:
        check_resolved(parse_spec(tree, source="f.yaml"))
    assert "row 1; each row needs instruction, answer and kind" in str(info.value)
    tree["pipeline"]["transcripts"]["path"] = str(EXAMPLE.parent / "transcripts.jsonl")
    tree["rollout"]["manager"]["evaluators"]["default"]["scaffold"] = "terminal"
    tree["rollout"]["manager"]["evaluators"]["default"].pop("scaffold_options")
    with pytest.raises(PipelineConfigError) as info:
        check_resolved(parse_spec(tree, source="f.yaml"))
    assert "runs scaffold 'terminal'; transcripts are for black-box scaffolds" in str(info.value)


def test_config_checks_resolve_a_black_box_scaffold_as_the_rollout_service_runs_it() -> None:
    from stacx.infra.checks import rollout_config_problem
    from stacx.rollout.config import RolloutConfig
    from stacx.schemas.config import build

    section: dict[str, Any] = {
        "data": {"path": "tasks.jsonl"},
        "sandbox": {"url": "http://127.0.0.1:9"},
        "manager": {"evaluators": {"default": {"scaffold": "mini-swe-agent", "reward": "verifier"}}},
    }
    config = build(RolloutConfig, section, where="config")
    assert rollout_config_problem(config) is None  # the service starts the proxy
