"""OpenHands (openhands-sdk + openhands-tools in their own Python 3.12 venv, Agent, LLM and
Conversation unchanged) as a black-box scaffold against the real services: the built-in inference
server through the in-process agent proxy, the sandbox gateway on Docker, the cookbook's
simple-task (a Harbor task; its verifier runs its tests).

The tiny model cannot write an OpenHands tool call by itself, so the agent's LLM asks the server
for constrained decoding (SGLang's `regex`, sent by LiteLLM as extra body): the model still
samples every token (its own probabilities, renormalised over what the pattern allows), and
the pattern is one terminal call that solves the task. Then:

- the trajectory's tokens are the calls' prompts and sampled tokens, mask 1 exactly on them, and
  its logprobs are the model's own under the same constraint (teacher forcing, checked here with
  the server's grammar module);
- the command ran in the sandbox: the task's verifier finds /app/hello.txt there (reward 1), the
  sandbox's own `cat` shows it, and this host has no /app/hello.txt.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest
from harbor_cookbook import cookbook

from stacx.producers.event_producer import Delivery
from stacx.rollout.adapters import GatewayEnvironments, InferenceAdapter
from stacx.rollout.blackbox.capture import CallCapture
from stacx.rollout.data import ListTaskSource
from stacx.rollout.evaluator import Evaluator
from stacx.rollout.fakes import MemoryPublisher, StaticVersion
from stacx.rollout.manager import RolloutManager
from stacx.rollout.tokens import HFTokenizer
from stacx.schemas.records import AgentInteraction, TaskSample, Trajectory, TrajectoryStatus

TOKEN = "openhands-it"
VERSION = 3
COMMAND = "printf 'Hello, world!' > /app/hello.txt; cat /app/hello.txt; echo; hostname #"
"""Solves simple-task, and shows where it ran: the sandbox's host name. The model
writes the comment after `#` freely (its own choice of letters)."""
CALL = "<function=terminal>\n<parameter=command>{}</parameter>\n</function>"
"""OpenHands' own text form of a terminal call (what its prompt teaches and it re-renders)."""


def _regex() -> str:
    head, tail = (re.escape(part) for part in CALL.split("{}"))
    return f"{head}{re.escape(COMMAND)}[a-z ]{{1,12}}{tail}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stacx.rollout.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny", max_position_embeddings=65536)


@pytest.fixture(scope="module")
def inference_url(model_dir: Path) -> Iterator[str]:
    from stacx.rollout.inference import InferenceServer

    server = InferenceServer(
        InferenceServer.Config(
            model_path=str(model_dir), port=0, device="cpu", torch_threads=1, weight_version=str(VERSION)
        )
    )
    url = server.start(timeout_s=120)
    try:
        yield url
    finally:
        server.stop()


class _Recording:
    """A `Publisher` keeping the proxy's AgentInteraction records: what the server answered."""

    def __init__(self) -> None:
        self.calls: list[AgentInteraction] = []

    def publish(self, topic: str, record: object, **kwargs: object) -> Future[Delivery]:
        if isinstance(record, AgentInteraction):
            self.calls.append(record)
        done: Future[Delivery] = Future()
        done.set_result(Delivery(topic=topic, partition=0, offset=-1, timestamp_ms=0, record_id=""))
        return done

    def flush(self, timeout_s: float | None = None) -> int:
        return 0

    def close(self, timeout_s: float | None = None) -> None:
        return None


@pytest.fixture(scope="module")
def gateway(sandbox_image: str) -> Iterator[tuple[str, str]]:
    from stacx.infra.services import harbor_images
    from stacx.sandbox.backends import DockerBackend
    from stacx.sandbox.images import TaskImageBuilder
    from stacx.sandbox.sessions import SessionManager
    from stacx.sandbox.testing import serve_gateway

    harbor_images.build()
    owner = f"test-openhands-{uuid.uuid4().hex[:8]}"
    config = SessionManager.Config(owner=owner, default_image=sandbox_image)
    with serve_gateway(DockerBackend(), token=TOKEN, config=config, images=TaskImageBuilder()) as url:
        yield url, owner


def _task() -> TaskSample:
    from stacx.sandbox.tasks import load_task, to_task_sample

    return to_task_sample(load_task(cookbook() / "simple-task"))


async def _run(
    gateway: tuple[str, str],
    model_dir: Path,
    inference_url: str,
    evaluator: Evaluator.Config,
    task: TaskSample | None = None,
) -> tuple[Trajectory, list[AgentInteraction]]:
    from stacx.rollout.inference import InferenceClient
    from stacx.sandbox.client import SandboxClient

    forward = _Recording()
    capture = CallCapture(
        CallCapture.Config(upstream=inference_url, tokenizer_path=str(model_dir)), forward=forward
    )
    capture.start()
    config = RolloutManager.Config(
        model_name="tiny",
        evaluators={"default": evaluator},
        pool={"sandboxes": 1, "cpu": 2, "memory_mb": 4096, "generations": 1},
    )
    publisher = MemoryPublisher()
    inference = InferenceClient(InferenceClient.Config(base_url=inference_url))
    try:
        async with SandboxClient(SandboxClient.Config(base_url=gateway[0], token=TOKEN)) as sandbox:
            manager = RolloutManager(
                config,
                source=ListTaskSource([task or _task()], ListTaskSource.Config(samples_per_task=1)),
                tokenizer=HFTokenizer(str(model_dir)),
                inference=InferenceAdapter(inference),
                publisher=publisher,
                sandbox=GatewayEnvironments(sandbox),
                versions=StaticVersion(VERSION),
                capture=capture,
            )
            await manager.run()
            await manager.close()
    finally:
        await inference.close()
        capture.close()
    [trajectory] = publisher.published
    return trajectory, forward.calls


def _constrained_logprobs(
    model_dir: Path, ids: np.ndarray, starts: list[tuple[int, int]], regex: str
) -> np.ndarray:
    """Teacher-forced logprobs of each generated span [a, b) under `regex` (as the server samples)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stacx.rollout.inference.grammar import GrammarCompiler

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        logits = model(torch.tensor(ids[None, :], dtype=torch.long)).logits[0].float()
    out = np.zeros(len(ids))
    eos = model.generation_config.eos_token_id
    stops = frozenset([*(eos if isinstance(eos, list) else [eos]), tokenizer.eos_token_id])
    for a, b in starts:
        guide = GrammarCompiler(tokenizer).guide(regex=regex, json_schema=None, stop_ids=stops)
        for k in range(a, b):
            allowed = torch.full_like(logits[k - 1], float("-inf"))
            allowed[guide.allowed()] = 0.0
            out[k] = torch.log_softmax(logits[k - 1] + allowed, -1)[int(ids[k])].item()
            guide.advance(int(ids[k]))
    return out


def _spans(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
    return list(zip(np.nonzero(edges == 1)[0].tolist(), np.nonzero(edges == -1)[0].tolist(), strict=True))


async def test_openhands_agent_runs_in_the_sandbox_and_is_captured_token_exact(
    gateway: tuple[str, str], model_dir: Path, inference_url: str
) -> None:
    regex = _regex()
    evaluator = Evaluator.Config(
        scaffold="openhands",
        scaffold_options={"llm": {"litellm_extra_body": {"regex": regex}}},
        reward="verifier",
        max_turns=2,
        max_new_tokens=512,
        max_tokens=65536,
        episode_timeout_s=600.0,
        episode={"sandboxes": 1, "memory_mb": 1024},
        step={"cpu": 0.5},
    )
    trajectory, calls = await _run(gateway, model_dir, inference_url, evaluator)
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.metadata["scaffold"] == "openhands"
    assert trajectory.metadata["num_model_calls"] == "2" and len(calls) == 2
    assert trajectory.metadata["num_dropped_calls"] == "0"
    assert int(trajectory.metadata["scaffold_num_commands"]) == 2
    # The verifier ran the task's tests in the sandbox: the agent's command made /app/hello.txt there.
    assert trajectory.reward == 1.0
    assert not Path("/app/hello.txt").exists()

    ids, mask, lps = trajectory.token_ids, trajectory.loss_mask, trajectory.logprobs
    turns = trajectory.turns
    assert np.array_equal(ids, np.concatenate([t.token_ids for t in turns]))
    expected = np.concatenate([np.full(len(t.token_ids), t.role == "assistant") for t in turns])
    assert np.array_equal(mask, expected.astype(np.uint8))
    # What the server sampled, call by call (the proxy's records), is the trajectory's, in order.
    spans = _spans(mask)
    assert len(spans) == 2
    for (a, b), call in zip(spans, calls, strict=True):
        num_prompt = int(call.metadata["prompt_length"])
        assert ids[:a].tolist() == [int(t) for t in call.token_ids[:num_prompt]]
        assert ids[a:b].tolist() == [int(t) for t in call.token_ids[num_prompt:]]
        assert np.allclose(lps[a:b], np.asarray(call.logprobs[num_prompt:], dtype=float))
        assert re.fullmatch(regex, call.response)
    assert all(t.policy_version == VERSION for t in turns if t.role == "assistant")
    assert np.all(lps[mask == 0] == 0.0)
    np.testing.assert_allclose(
        lps[mask == 1], _constrained_logprobs(model_dir, ids, spans, regex)[mask == 1], atol=2e-3
    )
    # The second prompt carries the sandbox's answer to the first command, as OpenHands shows it.
    observation = next(t.text for t in turns if t.role == "tool")
    assert "EXECUTION RESULT of [terminal]" in observation and "exit code 0" in observation
    ran_on = observation.split("Hello, world!\n", 1)[1].split("\n", 1)[0]
    assert ran_on and ran_on != socket.gethostname()  # the sandbox's host name, not this machine's
    messages = json.loads(calls[1].messages)
    assert any("Create a file called hello.txt" in json.dumps(m) for m in messages)
    _assert_leak_free(gateway[1])


def _assert_leak_free(owner: str) -> None:
    import docker

    left = docker.from_env().containers.list(all=True, filters={"label": f"stacx.sandbox.owner={owner}"})
    assert left == [], f"leaked containers: {left}"


async def test_openhands_terminal_and_file_editor_act_on_the_sandbox(gateway: tuple[str, str]) -> None:
    """The gateway tools, driven without a model (OpenHands' own FileEditor on the mirror): every
    edit lands in the sandbox, as the sandbox's own `cat` shows, and nothing on this host."""
    import asyncio
    import os

    from stacx.rollout.blackbox.adapter import DRIVERS, build_external
    from stacx.rollout.blackbox.venvs import ensure_python
    from stacx.sandbox.client import SandboxClient

    python = await asyncio.to_thread(ensure_python, build_external("openhands", {}))
    probe = Path(__file__).resolve().parent / "scaffold_drivers" / "openhands_tools_probe.py"
    async with SandboxClient(SandboxClient.Config(base_url=gateway[0], token=TOKEN)) as sandbox:
        async with sandbox.session(task_dir=str(cookbook() / "simple-task")) as session:
            spec = {"gateway_url": gateway[0], "gateway_token": TOKEN, "sandbox_session": session.id}
            proc = await asyncio.create_subprocess_exec(
                python,
                str(probe),
                json.dumps(spec),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": str(DRIVERS), "OPENHANDS_SUPPRESS_BANNER": "1"},
            )
            stdout, stderr = await proc.communicate()
            assert proc.returncode == 0, stderr.decode()[-2000:]
            steps = json.loads(stdout.decode().strip().splitlines()[-1])
            in_sandbox = await sandbox.exec(session.id, "cat /app/pkg/mod.py")
    assert steps["sandbox_dir"] == "/app"
    assert steps["pwd"]["text"].strip() == "/app/pkg"  # the terminal's directory carries over
    assert (
        not steps["create"]["error"]
        and "File created successfully at: /app/pkg/mod.py" in steps["create"]["text"]
    )
    assert "has been edited" in steps["replace"]["text"] and "/app/pkg/mod.py" in steps["replace"]["text"]
    assert "return 2" in steps["view_file"]["text"]
    assert "/app/pkg/mod.py" in steps["view_dir"]["text"] and "/app/pkg/" in steps["view_dir"]["text"]
    assert "Last edit to /app/pkg/mod.py undone successfully" in steps["undo"]["text"]
    assert (
        steps["bad_replace"]["error"]
        and "did not appear verbatim in /app/pkg/mod.py" in steps["bad_replace"]["text"]
    )
    assert all("mirror" not in step["text"] for step in steps.values() if isinstance(step, dict))
    assert steps["input"]["error"]
    assert steps["slow"]["exit_code"] == -1 and "timed out" in steps["slow"]["text"]
    assert steps["failing"]["exit_code"] == 7
    # Hostile inputs: OpenHands' own refusal where the sandbox has no such directory, then the
    # file made once it has; a relative path is the sandbox's WORKDIR's; our marker in the output.
    assert steps["odd_create"]["error"] and "/app/we ird's/x.txt" in steps["odd_create"]["text"]
    assert not steps["odd_create_again"]["error"] and "odd" in steps["relative_view"]["text"]
    assert (
        "__STACX_CWD__/nowhere" in steps["marker"]["text"] and steps["after_marker"]["text"].strip() == "/tmp"
    )
    # The sandbox's own state: the undo went back to the created text; this host has none of it.
    assert in_sandbox.stdout == "def f():\n    return 1\n"
    assert not Path("/app/pkg").exists()


SWE = Path(__file__).resolve().parents[3] / "examples" / "swe"


@pytest.fixture(scope="module")
def swe_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/swe's tasks, generated (and validated) in a folder of this test's."""
    sys.path.insert(0, str(SWE))
    try:
        from make_tasks import write_tasks

        return write_tasks(tmp_path_factory.mktemp("swe"))
    finally:
        sys.path.remove(str(SWE))


@pytest.mark.parametrize("task", ["heldout/inflection-humanize-id", "train/inflection-ordinal-teens"])
async def test_swe_tasks_grade_as_swe_bench_gold_resolves_and_the_empty_patch_does_not(
    gateway: tuple[str, str], swe_tasks: Path, task: str
) -> None:
    """examples/swe tasks in the real sandbox: the gold patch resolves (reward 1, every FAIL_TO_PASS
    and PASS_TO_PASS passes), the untouched repository does not; tests the agent edits are reset."""
    from stacx.sandbox.client import SandboxClient

    task_dir = swe_tasks / task
    async with SandboxClient(SandboxClient.Config(base_url=gateway[0], token=TOKEN)) as sandbox:
        async with sandbox.session(task_dir=str(task_dir)) as session:
            # The agent "fixes" the tests instead of the code: reset by the grader, so no reward.
            await sandbox.exec(session.id, "printf 'def test_nothing():\\n    pass\\n' > test_inflection.py")
            empty = await sandbox.verify(session.id, task_dir)
        async with sandbox.session(task_dir=str(task_dir)) as session:
            solved = await sandbox.run_oracle(session.id, task_dir)
            gold = await sandbox.verify(session.id, task_dir)
    assert solved.exit_code == 0, solved.stderr
    assert gold.rewards == {"reward": 1.0, "fail_to_pass": 1.0, "pass_to_pass": 1.0}, gold.stdout[-2000:]
    assert (
        empty.reward == 0.0 and empty.rewards["fail_to_pass"] == 0.0 and empty.rewards["pass_to_pass"] == 1.0
    )


async def test_openhands_fixes_a_held_out_swe_task_with_its_file_editor(
    gateway: tuple[str, str], model_dir: Path, inference_url: str, swe_tasks: Path
) -> None:
    """The agent's file_editor str_replace (the model's sampled call, constrained to the gold edit)
    lands in the sandbox's repository: the SWE-bench grading resolves the task."""
    sys.path.insert(0, str(SWE))
    from make_tasks import BUGS, MODULE, WORKDIR

    from stacx.sandbox.tasks import load_task, to_task_sample

    bug = next(b for b in BUGS if b.name == "humanize-id")
    call = (
        "<function=file_editor>\n<parameter=command>str_replace</parameter>\n"
        f"<parameter=path>{WORKDIR}/{MODULE}</parameter>\n<parameter=old_str>{bug.bad}</parameter>\n"
        f"<parameter=new_str>{bug.good}</parameter>\n</function>"
    )
    evaluator = Evaluator.Config(
        scaffold="openhands",
        scaffold_options={"llm": {"litellm_extra_body": {"regex": re.escape(call)}}},
        reward="verifier",
        max_turns=1,
        max_new_tokens=512,
        max_tokens=65536,
        episode_timeout_s=600.0,
        episode={"sandboxes": 1, "memory_mb": 1024},
        step={"cpu": 0.5},
    )
    task = to_task_sample(load_task(swe_tasks / "heldout" / "inflection-humanize-id"))
    trajectory, calls = await _run(gateway, model_dir, inference_url, evaluator, task)
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert len(calls) == 1 and calls[0].response == call
    assert trajectory.rewards == {"reward": 1.0, "fail_to_pass": 1.0, "pass_to_pass": 1.0}
    _assert_leak_free(gateway[1])
