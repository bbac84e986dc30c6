"""Rollout against the real services: built-in inference server, gateway + Docker, Kafka.

Episodes of the arithmetic task arrive on a fresh Kafka topic with the exact tokens, a loss mask
on generated tokens only, the server's logprobs (checked against a teacher-forced forward pass of
the same model) and the server's weight version on every turn. A second test drives the tool path
(a scripted policy) through real Docker sandboxes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from stacx.rollout.adapters import GatewayEnvironments, InferenceAdapter, KafkaTrajectoryPublisher
from stacx.rollout.data import ListTaskSource
from stacx.rollout.evaluator import Evaluator
from stacx.rollout.fakes import StaticVersion
from stacx.rollout.manager import RolloutManager
from stacx.rollout.tokens import HFTokenizer
from stacx.schemas.records import TaskSample, Trajectory, TrajectoryStatus

TOKEN = "rollout-it"
WEIGHT_VERSION = 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stacx.rollout.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="module")
def inference_url(model_dir: Path) -> Iterator[str]:
    from stacx.rollout.inference import InferenceServer

    server = InferenceServer(
        InferenceServer.Config(
            model_path=str(model_dir),
            port=0,
            device="cpu",
            torch_threads=1,
            weight_version=str(WEIGHT_VERSION),
        )
    )
    url = server.start(timeout_s=120)
    try:
        yield url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gateway(sandbox_image: str) -> Iterator[tuple[str, str]]:
    from stacx.sandbox.backends import DockerBackend
    from stacx.sandbox.sessions import SessionManager
    from stacx.sandbox.testing import serve_gateway

    owner = f"test-rollout-{uuid.uuid4().hex[:8]}"
    config = SessionManager.Config(owner=owner, default_image=sandbox_image)
    with serve_gateway(DockerBackend(), token=TOKEN, config=config) as url:
        yield url, owner


def _tasks(num: int) -> list[TaskSample]:
    return [
        TaskSample(
            task_id=f"arith-{i}",
            task_type="arithmetic_tool",
            prompt=f"What is {6 + i}*7?",
            data=f'{{"answer": {(6 + i) * 7}}}',
        )
        for i in range(num)
    ]


def _consume(bootstrap: str, topic: str, group: str, count: int) -> list[Trajectory]:
    from stacx.consumers import EventConsumer

    consumer = EventConsumer(
        EventConsumer.Config(bootstrap_servers=bootstrap, group_id=group, topics=[topic])
    )
    records: list[Trajectory] = []
    try:
        for _ in range(120):
            records += [e.value for e in consumer.consume(max_records=count, timeout=1.0)]
            if len(records) >= count:
                break
    finally:
        consumer.close()
    return records


def _manager(config: RolloutManager.Config, tasks, samples, **seams) -> RolloutManager:
    source = ListTaskSource(tasks, ListTaskSource.Config(samples_per_task=samples))
    return RolloutManager(config, source=source, versions=StaticVersion(WEIGHT_VERSION), **seams)


def _assert_leak_free(owner: str) -> None:
    import docker

    left = docker.from_env().containers.list(all=True, filters={"label": f"stacx.sandbox.owner={owner}"})
    assert left == [], f"leaked containers: {left}"


async def test_model_episodes_arrive_on_kafka_with_masks_logprobs_versions(
    model_dir: Path,
    inference_url: str,
    gateway: tuple[str, str],
    kafka_bootstrap: str,
    fresh_topic,
    fresh_group: str,
) -> None:
    from stacx.rollout.inference import InferenceClient
    from stacx.sandbox.client import SandboxClient

    topic = fresh_topic("trajectories", partitions=2)
    evaluator = Evaluator.Config(
        scaffold="retool",
        reward="exact_answer",
        max_turns=2,
        max_new_tokens=12,
        max_tokens=400,
        temperature=1.0,
        episode={"sandboxes": 1, "memory_mb": 256},
        step={"cpu": 0.5},
    )
    config = RolloutManager.Config(
        model_name="tiny",
        evaluators={"arithmetic_tool": evaluator},
        pool={"sandboxes": 4, "cpu": 2, "memory_mb": 2048, "generations": 4},
    )
    tokenizer = HFTokenizer(str(model_dir))
    inference = InferenceClient(InferenceClient.Config(base_url=inference_url))
    async with SandboxClient(SandboxClient.Config(base_url=gateway[0], token=TOKEN)) as sandbox:
        publisher = KafkaTrajectoryPublisher(bootstrap_servers=kafka_bootstrap, topic=topic)
        manager = _manager(
            config,
            _tasks(2),
            2,
            tokenizer=tokenizer,
            inference=InferenceAdapter(inference),
            publisher=publisher,
            sandbox=GatewayEnvironments(sandbox),
        )
        summary = await manager.run()
        await manager.close()
    await inference.close()
    assert summary.num_episodes == 4 and summary.num_publish_errors == 0
    assert "FAILED" not in summary.by_status, manager.summary

    records = _consume(kafka_bootstrap, topic, fresh_group, 4)
    assert sorted((t.task_id, t.sample_index) for t in records) == [
        ("arith-0", 0),
        ("arith-0", 1),
        ("arith-1", 0),
        ("arith-1", 1),
    ]
    assert len({t.group_id for t in records}) == 2
    for trajectory in records:
        _check_tokens(trajectory, model_dir, tokenizer)
    _assert_leak_free(gateway[1])


def _check_tokens(trajectory: Trajectory, model_dir: Path, tokenizer: HFTokenizer) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    ids, mask, lps = trajectory.token_ids, trajectory.loss_mask, trajectory.logprobs
    assert len(ids) == len(mask) == len(lps)
    turns = trajectory.turns
    assert np.array_equal(ids, np.concatenate([t.token_ids for t in turns]))
    expected_mask = np.concatenate([np.full(len(t.token_ids), t.role == "assistant") for t in turns])
    assert np.array_equal(mask, expected_mask.astype(np.uint8))
    assert mask[: trajectory.prompt_length].sum() == 0 and mask.sum() > 0
    assert np.all(lps[mask == 0] == 0.0)
    assert all(t.policy_version == WEIGHT_VERSION for t in turns if t.role == "assistant")
    assert trajectory.policy_version == WEIGHT_VERSION
    prompt = tokenizer.decode(ids[: trajectory.prompt_length])
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        logits = model(torch.tensor(ids[None, :], dtype=torch.long)).logits[0].float()
    teacher = (
        torch.log_softmax(logits[:-1], dim=-1)
        .gather(1, torch.tensor(ids[1:], dtype=torch.long)[:, None])[:, 0]
        .numpy()
    )
    generated = np.nonzero(mask)[0]
    np.testing.assert_allclose(lps[generated], teacher[generated - 1], atol=2e-3)


async def test_tool_calls_run_in_real_sandboxes_and_reach_kafka(
    gateway: tuple[str, str],
    kafka_bootstrap: str,
    fresh_topic,
    fresh_group: str,
) -> None:
    from stacx.rollout.fakes import FakeTokenizer, ScriptedInference
    from stacx.sandbox.client import SandboxClient

    def policy(context: str, call: int) -> str:
        if "<tool_response>\n" in context:
            return "<answer>" + context.rsplit("<tool_response>\n", 1)[1].split("\n")[0] + "</answer>"
        return "<tool_call>import math\nprint(6*7)</tool_call>"

    topic = fresh_topic("trajectories", partitions=2)
    tokenizer = FakeTokenizer()
    config = RolloutManager.Config(
        model_name="scripted", pool={"sandboxes": 3, "cpu": 3, "memory_mb": 2048, "generations": 3}
    )
    async with SandboxClient(SandboxClient.Config(base_url=gateway[0], token=TOKEN)) as sandbox:
        publisher = KafkaTrajectoryPublisher(bootstrap_servers=kafka_bootstrap, topic=topic)
        manager = _manager(
            config,
            _tasks(3),
            2,
            tokenizer=tokenizer,
            inference=ScriptedInference(tokenizer, policy, version=lambda: WEIGHT_VERSION),
            publisher=publisher,
            sandbox=GatewayEnvironments(sandbox),
        )
        summary = await manager.run()
        await manager.close()
    assert summary.by_status == {"COMPLETED": 6}
    records = _consume(kafka_bootstrap, topic, fresh_group, 6)
    assert len(records) == 6
    for trajectory in records:
        tool = next(t for t in trajectory.turns if t.role == "tool")
        assert tool.text == "\n<tool_response>\n42\n\n</tool_response>\n"
        assert trajectory.status is TrajectoryStatus.COMPLETED
        assert trajectory.reward == (1.0 if trajectory.task_id == "arith-0" else 0.0)
        assert trajectory.metadata["sandbox_id"]
    _assert_leak_free(gateway[1])


async def test_service_builds_real_clients_and_follows_weights_from_kafka(
    model_dir: Path,
    inference_url: str,
    gateway: tuple[str, str],
    kafka_bootstrap: str,
    fresh_topic,
    fresh_group: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio
    import json

    from stacx.producers import EventProducer
    from stacx.rollout.config import RolloutConfig
    from stacx.rollout.service import _versions, run_rollout
    from stacx.schemas.config import build
    from stacx.schemas.records import WeightVersion

    trajectories = fresh_topic("trajectories", partitions=2)
    weights = fresh_topic("weights", config={"cleanup.policy": "compact"})
    with EventProducer(EventProducer.Config(bootstrap_servers=kafka_bootstrap)) as producer:
        for version in (1, WEIGHT_VERSION):
            producer.publish(
                weights, WeightVersion(model_name="tiny", version=version, path="/w"), key="tiny"
            ).result(timeout=30)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps(
                {"task_id": f"s{i}", "task_type": "sums", "prompt": f"{i}+1?", "data": {"answer": i + 1}}
            )
            + "\n"
            for i in range(2)
        )
    )
    monkeypatch.setenv("ROLLOUT_IT_TOKEN", TOKEN)
    config = build(
        RolloutConfig,
        {
            "data": {"path": str(tasks), "samples_per_task": 2},
            "inference": {"url": inference_url, "tokenizer": str(model_dir)},
            "sandbox": {"url": gateway[0], "token_env": "ROLLOUT_IT_TOKEN"},
            "kafka": {
                "bootstrap_servers": kafka_bootstrap,
                "trajectories_topic": trajectories,
                "weights_topic": weights,
            },
            "manager": {
                "model_name": "tiny",
                "pool": {"sandboxes": 2, "cpu": 2, "memory_mb": 1024, "generations": 2},
                "evaluators": {
                    "sums": {
                        "scaffold": "retool",
                        "max_turns": 1,
                        "max_new_tokens": 8,
                        "episode": {"sandboxes": 1, "memory_mb": 256},
                        "step": {"cpu": 0.5},
                    }
                },
            },
            "progress": False,
        },
        where="config",
    )
    versions = _versions(config)
    try:
        for _ in range(600):
            if versions.current() == WEIGHT_VERSION:
                break
            await asyncio.sleep(0.1)
        assert versions.current() == WEIGHT_VERSION
        summary = await run_rollout(config, versions=versions)
    finally:
        versions.close()  # type: ignore[attr-defined]
    assert summary.num_episodes == 4 and summary.num_publish_errors == 0
    records = _consume(kafka_bootstrap, trajectories, fresh_group, 4)
    assert len(records) == 4
    assert {t.policy_version for t in records} == {WEIGHT_VERSION}
    assert all(t.metadata["sandbox_id"] for t in records)
    _assert_leak_free(gateway[1])
