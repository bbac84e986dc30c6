"""Black-box scaffolds in the rollout engine, against the real services: the built-in inference
server (through the in-process agent proxy), the sandbox gateway on Docker, the cookbook's
simple-task (a Harbor task; the verifier runs its tests).

- mini-swe-agent (its own venv, unchanged DefaultAgent + litellm model): its actions run in the
  sandbox through the gateway, the tokens of the trajectory are exactly what the server sampled
  (teacher-forced logprobs of the same model agree), observations are loss-masked, the reward is
  the verifier's;
- a scripted scaffold (one small test file) that solves the task after one model call: reward 1;
- faults: a crashing, a never-returning and a garbage-emitting scaffold end FAILED / TIMED_OUT /
  FAILED, no container or process is left, and the engine then still serves an episode.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from harbor_cookbook import cookbook
from process_checks import gone

from stacx.rollout.adapters import GatewayEnvironments, InferenceAdapter
from stacx.rollout.blackbox.adapter import ExternalScaffold, register
from stacx.rollout.blackbox.capture import CallCapture
from stacx.rollout.data import ListTaskSource
from stacx.rollout.evaluator import Evaluator
from stacx.rollout.fakes import MemoryPublisher, StaticVersion
from stacx.rollout.manager import RolloutManager
from stacx.rollout.tokens import HFTokenizer
from stacx.schemas.records import TaskSample, Trajectory, TrajectoryStatus

TOKEN = "scaffolds-it"
VERSION = 5
SCRIPTED = Path(__file__).resolve().parent / "scaffold_drivers" / "scripted.py"


@register("scripted-test")
@dataclass(kw_only=True, slots=True)
class ScriptedScaffold(ExternalScaffold):
    """A third scaffold in a few lines: the driver file is all it takes."""

    driver: str = str(SCRIPTED)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stacx.rollout.models import make_tiny_model

    # Terminus-2's first prompt alone is ~7k tokens of the tiny tokenizer.
    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny", max_position_embeddings=32768)


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


@pytest.fixture(scope="module")
def capture(inference_url: str, model_dir: Path) -> Iterator[CallCapture]:
    proxy = CallCapture(CallCapture.Config(upstream=inference_url, tokenizer_path=str(model_dir)))
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture(scope="module")
def gateway(sandbox_image: str) -> Iterator[tuple[str, str]]:
    from stacx.infra.services import harbor_images
    from stacx.sandbox.backends import DockerBackend
    from stacx.sandbox.images import TaskImageBuilder
    from stacx.sandbox.sessions import SessionManager
    from stacx.sandbox.testing import serve_gateway

    harbor_images.build()
    owner = f"test-scaffolds-{uuid.uuid4().hex[:8]}"
    config = SessionManager.Config(owner=owner, default_image=sandbox_image)
    with serve_gateway(DockerBackend(), token=TOKEN, config=config, images=TaskImageBuilder()) as url:
        yield url, owner


def _task() -> TaskSample:
    from stacx.sandbox.tasks import load_task, to_task_sample

    return to_task_sample(load_task(cookbook() / "simple-task"))


async def _run(
    gateway: tuple[str, str],
    capture: CallCapture,
    model_dir: Path,
    inference_url: str,
    evaluators: dict[str, Evaluator.Config],
    tasks: list[TaskSample],
) -> list[Trajectory]:
    from stacx.rollout.inference import InferenceClient
    from stacx.sandbox.client import SandboxClient

    config = RolloutManager.Config(
        model_name="tiny",
        evaluators=evaluators,
        pool={"sandboxes": 3, "cpu": 3, "memory_mb": 8192, "generations": 3},
    )
    publisher = MemoryPublisher()
    inference = InferenceClient(InferenceClient.Config(base_url=inference_url))
    async with SandboxClient(SandboxClient.Config(base_url=gateway[0], token=TOKEN)) as sandbox:
        manager = RolloutManager(
            config,
            source=ListTaskSource(tasks, ListTaskSource.Config(samples_per_task=1)),
            tokenizer=HFTokenizer(str(model_dir)),
            inference=InferenceAdapter(inference),
            publisher=publisher,
            sandbox=GatewayEnvironments(sandbox),
            versions=StaticVersion(VERSION),
            capture=capture,
        )
        await manager.run()
        await manager.close()
    await inference.close()
    return publisher.published


def _evaluator(scaffold: str, **fields: object) -> Evaluator.Config:
    base: dict[str, object] = {
        "scaffold": scaffold,
        "reward": "verifier",
        "max_turns": 3,
        "max_new_tokens": 16,
        "max_tokens": 8192,
        "episode_timeout_s": 300.0,
        "episode": {"sandboxes": 1, "memory_mb": 1024},
        "step": {"cpu": 0.5},
    }
    return Evaluator.Config(**{**base, **fields})  # type: ignore[arg-type]


def _assert_leak_free(owner: str) -> None:
    import docker

    left = docker.from_env().containers.list(all=True, filters={"label": f"stacx.sandbox.owner={owner}"})
    assert left == [], f"leaked containers: {left}"


def _check_tokens(trajectory: Trajectory, model_dir: Path) -> None:
    """The sequence is the turns', mask 1 exactly on model turns, logprobs are the model's."""
    import torch
    from transformers import AutoModelForCausalLM

    ids, mask, lps = trajectory.token_ids, trajectory.loss_mask, trajectory.logprobs
    turns = trajectory.turns
    assert np.array_equal(ids, np.concatenate([t.token_ids for t in turns]))
    expected = np.concatenate([np.full(len(t.token_ids), t.role == "assistant") for t in turns])
    assert np.array_equal(mask, expected.astype(np.uint8))
    assert mask[: trajectory.prompt_length].sum() == 0 and mask.sum() > 0
    assert np.all(lps[mask == 0] == 0.0)
    assert all(t.policy_version == VERSION for t in turns if t.role == "assistant")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        logits = model(torch.tensor(ids[None, :], dtype=torch.long)).logits[0].float()
    teacher = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:], dtype=torch.long)[:, None])[
        :, 0
    ]
    generated = np.nonzero(mask)[0]
    np.testing.assert_allclose(lps[generated], teacher.numpy()[generated - 1], atol=2e-3)


async def test_mini_swe_agent_episode_is_captured_token_exact(
    gateway: tuple[str, str], capture: CallCapture, model_dir: Path, inference_url: str
) -> None:
    # Every model output is the action (the tiny model writes no ```mswea_bash_command``` block),
    # so each turn's text really runs in the sandbox and comes back as an observation.
    options = {"model": {"action_regex": r"\A(.+)\Z"}, "agent": {"max_consecutive_format_errors": 0}}
    [trajectory] = await _run(
        gateway,
        capture,
        model_dir,
        inference_url,
        {"default": _evaluator("mini-swe-agent", scaffold_options=options)},
        [_task()],
    )
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.metadata["scaffold"] == "mini-swe-agent"
    assert trajectory.metadata["scaffold_exit_status"] == "LimitsExceeded"
    assert trajectory.metadata["num_model_calls"] == "3"
    assert trajectory.metadata["num_dropped_calls"] == "0"
    assert sum(t.role == "assistant" for t in trajectory.turns) == 3
    observations = [t for t in trajectory.turns if t.role == "tool"]
    assert len(observations) == 2 and all("<returncode>" in t.text for t in observations)
    _check_tokens(trajectory, model_dir)
    assert trajectory.rewards.get("reward") == 0.0 and trajectory.reward == 0.0  # hello.txt never made
    _assert_leak_free(gateway[1])


async def test_transcripts_render_exactly_the_first_call_mini_swe_agent_sends(
    gateway: tuple[str, str], capture: CallCapture, model_dir: Path, inference_url: str
) -> None:
    """SFT transcripts (`stacx.rollout.blackbox.transcripts`) start with the very ids a captured
    mini-swe-agent episode starts with, under the scaffold GRPO example's options."""
    import yaml
    from transformers import AutoTokenizer

    from stacx.rollout.blackbox.adapter import build_external
    from stacx.rollout.blackbox.transcripts import TranscriptRenderer
    from stacx.sandbox.tasks import load_task, to_task_sample

    example = Path(__file__).resolve().parents[3] / "examples" / "scaffold_grpo"
    config = yaml.safe_load((example / "scaffold_grpo.yaml").read_text())
    options = config["rollout"]["manager"]["evaluators"]["default"]["scaffold_options"]
    task = to_task_sample(load_task(sorted((example / "heldout").iterdir())[0]))
    [trajectory] = await _run(
        gateway,
        capture,
        model_dir,
        inference_url,
        {"default": _evaluator("mini-swe-agent", scaffold_options=options, max_turns=1)},
        [task],
    )
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    renderer = TranscriptRenderer(
        build_external("mini-swe-agent", options), AutoTokenizer.from_pretrained(model_dir)
    )
    prompt = renderer.prompt_ids(task.prompt)
    assert trajectory.prompt_length == len(prompt)
    assert trajectory.token_ids[: len(prompt)].tolist() == prompt
    assert trajectory.turns[0].text.endswith(task.prompt + "<|im_end|>\n<|im_start|>assistant\n")
    _assert_leak_free(gateway[1])


def _task_with_tmux(tmp_path: Path) -> TaskSample:
    """simple-task with tmux in its image (Terminus-2 drives a tmux session)."""
    import shutil

    from stacx.sandbox.tasks import load_task, to_task_sample

    task_dir = tmp_path / "simple-task-tmux"
    shutil.copytree(cookbook() / "simple-task", task_dir)
    dockerfile = task_dir / "environment" / "Dockerfile"
    dockerfile.write_text(
        dockerfile.read_text()
        + "RUN apt-get update && apt-get install -y --no-install-recommends tmux"
        + " && rm -rf /var/lib/apt/lists/*\n"
    )
    return to_task_sample(load_task(task_dir))


async def test_terminus_2_episode_is_captured_token_exact(
    gateway: tuple[str, str], capture: CallCapture, model_dir: Path, inference_url: str, tmp_path: Path
) -> None:
    [trajectory] = await _run(
        gateway,
        capture,
        model_dir,
        inference_url,
        {"default": _evaluator("terminus-2", max_turns=2, episode_timeout_s=240.0)},
        [_task_with_tmux(tmp_path)],
    )
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.metadata["scaffold"] == "terminus-2"
    assert int(trajectory.metadata["num_model_calls"]) >= 2
    assert trajectory.metadata["num_dropped_calls"] == "0"
    assert any(t.role == "tool" for t in trajectory.turns)
    _check_tokens(trajectory, model_dir)
    assert trajectory.reward == 0.0
    _assert_leak_free(gateway[1])


async def test_scripted_scaffold_solves_and_verifier_rewards_it(
    gateway: tuple[str, str], capture: CallCapture, model_dir: Path, inference_url: str
) -> None:
    [trajectory] = await _run(
        gateway,
        capture,
        model_dir,
        inference_url,
        {"default": _evaluator("scripted-test", scaffold_options={"mode": "solve"})},
        [_task()],
    )
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.reward == 1.0
    _check_tokens(trajectory, model_dir)
    _assert_leak_free(gateway[1])


async def test_crashing_hanging_garbage_scaffolds_end_with_status_and_leave_nothing(
    gateway: tuple[str, str], capture: CallCapture, model_dir: Path, inference_url: str, tmp_path: Path
) -> None:
    pid_file = tmp_path / "hang.pid"
    base = _task()
    tasks = [
        TaskSample(**{**_fields(base), "task_id": mode, "task_type": mode})
        for mode in ("crash", "hang", "garbage")
    ]
    evaluators = {
        "crash": _evaluator("scripted-test", scaffold_options={"mode": "crash"}),
        "hang": _evaluator(
            "scripted-test",
            scaffold_options={"mode": "hang", "pid_file": str(pid_file)},
            episode_timeout_s=20.0,
        ),
        "garbage": _evaluator("scripted-test", scaffold_options={"mode": "garbage"}),
    }
    done = {t.task_id: t for t in await _run(gateway, capture, model_dir, inference_url, evaluators, tasks)}
    assert done["crash"].status is TrajectoryStatus.FAILED
    assert "exited with 3" in (done["crash"].error or "") and "blew up" in (done["crash"].error or "")
    assert done["hang"].status is TrajectoryStatus.TIMED_OUT
    assert done["garbage"].status is TrajectoryStatus.FAILED
    assert "malformed scaffold output" in (done["garbage"].error or "")
    assert all(t.reward == 0.0 for t in done.values())
    _assert_leak_free(gateway[1])
    child = int(pid_file.read_text())
    assert await gone(child), f"the hung scaffold's child {child} is still running"
    # The engine keeps serving: the next episode runs and is rewarded.
    [after] = await _run(
        gateway,
        capture,
        model_dir,
        inference_url,
        {"default": _evaluator("scripted-test", scaffold_options={"mode": "solve"})},
        [base],
    )
    assert after.status is TrajectoryStatus.COMPLETED and after.reward == 1.0
    _assert_leak_free(gateway[1])


def _fields(task: TaskSample) -> dict[str, object]:
    from dataclasses import fields

    return {f.name: getattr(task, f.name) for f in fields(task)}


async def test_the_rollout_service_starts_the_capture_proxy_for_a_black_box_scaffold(
    gateway: tuple[str, str],
    model_dir: Path,
    inference_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stacx.rollout.config import RolloutConfig
    from stacx.rollout.fakes import MemoryPublisher
    from stacx.rollout.service import run_rollout
    from stacx.schemas.config import build

    monkeypatch.setenv("SCAFFOLDS_IT_TOKEN", TOKEN)
    config = build(
        RolloutConfig,
        {
            "data": {"task_dirs": str(cookbook()), "samples_per_task": 2},
            "inference": {"url": inference_url, "tokenizer": str(model_dir)},
            "sandbox": {"url": gateway[0], "token_env": "SCAFFOLDS_IT_TOKEN"},
            "kafka": {"publish": False, "follow_weights": False},
            "manager": {
                "model_name": "tiny",
                "pool": {"sandboxes": 2, "cpu": 2, "memory_mb": 4096, "generations": 2},
                "evaluators": {
                    "default": vars_of(_evaluator("scripted-test", scaffold_options={"mode": "solve"}))
                },
            },
            "progress": False,
        },
        where="config",
    )
    publisher = MemoryPublisher()
    tasks = [_task()]  # what `stacx eval` loads from data.task_dirs
    summary = await run_rollout(config, publisher=publisher, tasks=tasks)
    assert summary.num_episodes == 2 and summary.by_status == {"COMPLETED": 2}
    assert [t.reward for t in publisher.published] == [1.0, 1.0]
    assert all(t.loss_mask.sum() > 0 for t in publisher.published)
    _assert_leak_free(gateway[1])


def vars_of(config: Evaluator.Config) -> dict[str, object]:
    from dataclasses import fields

    return {f.name: getattr(config, f.name) for f in fields(config)}
