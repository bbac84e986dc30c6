"""Black-box scaffolds without services: the prefix join of captured calls, the process runner's
outcomes (result, crash, garbage, a hang killed with its children), the adapter registry."""

from __future__ import annotations

import asyncio
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from process_checks import gone

from stacx.rollout.blackbox.adapter import EpisodeSpec, ExternalScaffold, build_external, is_external
from stacx.rollout.blackbox.join import join_calls
from stacx.rollout.blackbox.runner import ScaffoldCrashed, ScaffoldOutputError, ScaffoldRunner
from stacx.rollout.errors import ConfigError
from stacx.schemas.records import AgentInteraction, logprobs, loss_mask, token_ids


def _call(prompt: list[int], completion: list[int], n: int = 0) -> AgentInteraction:
    lps = [-0.5 - i for i in range(len(completion))]
    return AgentInteraction(
        session_id="s",
        interaction_id=f"i{n}",
        agent_name="a",
        model_name="m",
        policy_version=7,
        messages="[]",
        response=f"r{n}",
        token_ids=token_ids(prompt + completion),
        loss_mask=loss_mask([0] * len(prompt) + [1] * len(completion)),
        logprobs=logprobs([0.0] * len(prompt) + lps),
        metadata={"prompt_length": str(len(prompt)), "finish_reason": "stop"},
    )


def test_join_merges_calls_that_extend_the_context_and_masks_what_lies_between() -> None:
    first = _call([1, 2, 3], [10, 11], 0)
    second = _call([1, 2, 3, 10, 11, 20, 21], [12], 1)  # 20, 21: the observation
    joined = join_calls([first, second], decode=lambda ids: ",".join(map(str, ids)))
    ids, mask, lps = joined.buffer.arrays()
    assert ids.tolist() == [1, 2, 3, 10, 11, 20, 21, 12]
    assert mask.tolist() == [0, 0, 0, 1, 1, 0, 0, 1]
    np.testing.assert_allclose(lps, [0, 0, 0, -0.5, -1.5, 0, 0, -0.5])
    assert [t.role for t in joined.turns] == ["user", "assistant", "tool", "assistant"]
    assert joined.turns[2].text == "20,21"
    assert joined.prompt_length == 3 and joined.num_calls == 2 and joined.num_dropped_calls == 0
    assert all(t.policy_version == 7 for t in joined.turns if t.role == "assistant")


def test_join_restarts_at_a_call_whose_prompt_rewrote_the_history() -> None:
    calls = [_call([1, 2], [3], 0), _call([1, 2, 3, 4], [5], 1), _call([1, 9], [6], 2)]
    joined = join_calls(calls)
    ids, mask, _ = joined.buffer.arrays()
    assert ids.tolist() == [1, 9, 6] and mask.tolist() == [0, 0, 1]
    assert joined.num_calls == 1 and joined.num_dropped_calls == 2


@dataclass(kw_only=True, slots=True)
class _Script(ExternalScaffold):
    name: str = "script"


def _runner(tmp_path: Path, body: str) -> ScaffoldRunner:
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(body))
    return ScaffoldRunner(_Script(driver=str(driver)))


def _spec() -> EpisodeSpec:
    return EpisodeSpec(
        episode_id="e", task_id="t", instruction="do it", model_base_url="http://x/v1", model_name="m"
    )


async def test_runner_returns_the_driver_result_read_from_the_spec(tmp_path: Path) -> None:
    runner = _runner(
        tmp_path,
        """
        import json, sys
        from _stacx_episode import load_spec, write_result
        spec = load_spec()
        write_result(spec, {"exit_status": "Submitted", "echo": spec["instruction"]})
        """,
    )
    outcome = await runner.run(_spec())
    assert outcome.result == {"exit_status": "Submitted", "echo": "do it"}


async def test_runner_reports_a_crash_with_the_log_tail(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "import sys\nprint('boom here')\nsys.exit(4)\n")
    with pytest.raises(ScaffoldCrashed, match=r"exited with 4: boom here"):
        await runner.run(_spec())


@pytest.mark.parametrize("written", ["{not json", "[1, 2]", None])
async def test_runner_rejects_garbage_or_missing_results(tmp_path: Path, written: str | None) -> None:
    body = "print('noise')\n"
    if written is not None:
        body += "from _stacx_episode import load_spec\n"
        body += f"open(load_spec()['result_path'], 'w').write({written!r})\n"
    with pytest.raises(ScaffoldOutputError, match="malformed scaffold output"):
        await _runner(tmp_path, body).run(_spec())


async def test_cancelling_a_hung_scaffold_kills_its_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    runner = _runner(
        tmp_path,
        f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(600)
        """,
    )
    task = asyncio.create_task(runner.run(_spec()))
    while not pid_file.exists() or not pid_file.read_text():
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await gone(int(pid_file.read_text()))


def test_registry_names_the_shipped_scaffolds_and_refuses_unknown_ones() -> None:
    assert is_external("mini-swe-agent") and is_external("terminus-2") and not is_external("retool")
    adapter = build_external("mini-swe-agent", {"config": "mini"})
    assert adapter.options == {"config": "mini"} and adapter.requirements
    with pytest.raises(ConfigError, match="is not a known black-box scaffold adapter"):
        build_external("no-such-agent", {})
    with pytest.raises(ConfigError, match="driver"):
        _Script(driver="missing.py")


def test_a_black_box_evaluator_without_the_proxy_is_a_config_error() -> None:
    from stacx.rollout.evaluator import Evaluator
    from stacx.rollout.fakes import FakeTokenizer, ScriptedInference
    from stacx.rollout.resources import ResourcePool, Resources

    tokenizer = FakeTokenizer()
    with pytest.raises(ConfigError, match="needs the agent proxy"):
        Evaluator(
            Evaluator.Config(scaffold="mini-swe-agent", reward="verifier"),
            name="e",
            tokenizer=tokenizer,
            inference=ScriptedInference(tokenizer, lambda c, n: ""),
            environments=None,
            global_pool=ResourcePool(Resources.from_mapping({"generations": 1}, where="pool")),
        )


def test_capture_keeps_calls_by_episode_and_drops_late_ones() -> None:
    from stacx.rollout.blackbox.capture import CapturePublisher

    publisher = CapturePublisher()
    first, second = _call([1], [2], 0), _call([1], [3], 1)
    first.metadata["episode_id"], second.metadata["episode_id"] = "e1", "e2"
    publisher.publish("stacx.agent-logs", first).result()
    publisher.publish("stacx.agent-logs", second).result()
    assert [c.interaction_id for c in publisher.take("e1")] == ["i0"]
    publisher.publish("stacx.agent-logs", first).result()  # a call that ended after its episode
    assert publisher.take("e1") == [] and [c.interaction_id for c in publisher.take("e2")] == ["i1"]
