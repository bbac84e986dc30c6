"""DAgger through the real loop: a student and a teacher, each on its own built-in inference
server over HTTP; the rollout engine asks the teacher for its action on every state the student
visits; the label rows go to Kafka, the assembler packs them, the `dagger` trainer consumes the
batches. The batches carry the teacher's greedy action on the student's own state."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from assembly_worker import AssemblerProcess, consume_records
from confluent_kafka import Producer

from stacx.schemas.codec import encode
from stacx.schemas.records import TaskSample, TrainingBatch, WeightVersion

NUM_TASKS = 4


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Path, str]]]:
    """student (seed 0) and teacher (seed 1): same architecture, different weights."""
    from stacx.rollout.inference import InferenceServer
    from stacx.rollout.models import make_tiny_model

    started: dict[str, tuple[Path, str]] = {}
    running = []
    try:
        for name, seed in (("student", 0), ("teacher", 1)):
            path = make_tiny_model(tmp_path_factory.mktemp(name) / "tiny", seed=seed)
            server = InferenceServer(InferenceServer.Config(
                model_path=str(path), port=0, device="cpu", torch_threads=1, weight_version="0"))
            started[name] = (path, server.start(timeout_s=120))
            running.append(server)
        yield started
    finally:
        for server in running:
            server.stop()


def _assembler_config(bootstrap: str, names: dict[str, str], tmp_path: Path,
                      app_ids: list[str]) -> dict:
    app_ids.append(f"test-dagger-{uuid.uuid4().hex[:10]}")
    return {
        "app_id": app_ids[-1], "bootstrap_servers": bootstrap, "datadir": str(tmp_path / "data"),
        "tick_interval_s": 0.5,
        "grouping": {"group_size": 1, "group_timeout_s": 2.0, "partial_policy": "emit"},
        "mixture": {"batch_size": 2}, "filtering": {"max_staleness": 4}, **names,
    }


async def _roll_out(servers: dict[str, tuple[Path, str]], bootstrap: str, topic: str) -> int:
    from stacx.rollout.adapters import InferenceAdapter, KafkaTrajectoryPublisher
    from stacx.rollout.data import ListTaskSource
    from stacx.rollout.evaluator import Evaluator
    from stacx.rollout.fakes import StaticVersion
    from stacx.rollout.inference import InferenceClient
    from stacx.rollout.manager import RolloutManager
    from stacx.rollout.teacher import BetaSchedule, DAggerLabels, TeacherInTheLoop
    from stacx.rollout.tokens import HFTokenizer

    clients = {name: InferenceClient(InferenceClient.Config(base_url=url))
               for name, (_, url) in servers.items()}
    mixed = TeacherInTheLoop(
        TeacherInTheLoop.Config(beta=BetaSchedule(kind="constant", beta0=0.0)),
        student=InferenceAdapter(clients["student"]), teacher=InferenceAdapter(clients["teacher"]))
    tasks = [TaskSample(task_id=f"q-{i}", task_type="qa", prompt=f"What is {i}+{i}?",
                        data=f'{{"answer": {2 * i}}}') for i in range(NUM_TASKS)]
    config = RolloutManager.Config(
        model_name="tiny",
        evaluators={"qa": Evaluator.Config(scaffold="single_turn", reward="exact_answer",
                                           max_new_tokens=8, max_tokens=256, temperature=1.0)},
        pool={"cpu": 2, "memory_mb": 1024, "generations": 2})
    labels = DAggerLabels(KafkaTrajectoryPublisher(bootstrap_servers=bootstrap, topic=topic))
    manager = RolloutManager(
        config, source=ListTaskSource(tasks, ListTaskSource.Config(samples_per_task=1)),
        versions=StaticVersion(0), tokenizer=HFTokenizer(str(servers["student"][0])),
        inference=mixed, publisher=labels, sandbox=None)
    summary = await manager.run()
    await manager.close()
    for client in clients.values():
        await client.close()
    assert summary.num_episodes == NUM_TASKS and summary.num_publish_errors == 0
    assert mixed.num_student_actions == NUM_TASKS and mixed.num_teacher_actions == 0
    return labels.num_rows


async def _teacher_greedy(url: str, state: list[int], max_new_tokens: int) -> list[int]:
    from stacx.rollout.inference import InferenceClient
    from stacx.rollout.inference.sampling import SamplingParams

    async with InferenceClient(InferenceClient.Config(base_url=url)) as client:
        out = await client.generate(state, SamplingParams(max_new_tokens=max_new_tokens,
                                                          temperature=0.0))
    return list(out.output_ids)


async def test_dagger_batches_carry_teacher_labels_on_student_states(
    servers: dict[str, tuple[Path, str]], kafka_bootstrap: str,
    fresh_topic: Callable[..., str], fresh_group: str, tmp_path: Path, app_ids: list[str],
) -> None:
    from stacx.trainer import ModelConfig, SourceConfig, StacxTrainer
    from stacx.trainer.testing import tiny_trainer_config

    names = {"trajectories_topic": fresh_topic("dagger-traj", partitions=2),
             "batches_topic": fresh_topic("dagger-batches", config={"max.message.bytes": "8388608"}),
             "weights_topic": fresh_topic("dagger-weights"), "dlq_topic": fresh_topic("dagger-dlq")}
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(names["weights_topic"], key=b"tiny",
                     value=encode(WeightVersion(model_name="tiny", version=0, path="/w")))
    assert producer.flush(30) == 0
    config = _assembler_config(kafka_bootstrap, names, tmp_path, app_ids)
    with AssemblerProcess(config, tmp_path) as worker:
        worker.wait_for_line("latest weights tiny=0")
        num_rows = await _roll_out(servers, kafka_bootstrap, names["trajectories_topic"])
        assert num_rows == NUM_TASKS  # one labelled state per single-turn episode
        batches = [r[1] for r in consume_records(kafka_bootstrap, names["batches_topic"],
                                                 NUM_TASKS // 2)]
        worker.stop()

    rows = 0
    for batch in batches:
        assert isinstance(batch, TrainingBatch)
        for i in range(batch.num_sequences):
            span = slice(int(batch.offsets[i]), int(batch.offsets[i] + batch.lengths[i]))
            ids, mask = batch.token_ids[span], batch.loss_mask[span]
            prompt = int(batch.prompt_lengths[i])
            state, label = [int(x) for x in ids[:prompt]], [int(x) for x in ids[prompt:]]
            assert not mask[:prompt].any() and mask[prompt:].all() and label
            # the label is exactly the teacher's greedy action on the student's state
            assert await _teacher_greedy(servers["teacher"][1], state, 8) == label
            rows += 1
    assert rows == NUM_TASKS

    trainer_config = tiny_trainer_config("dagger", tmp_path / "trainer", source=SourceConfig(
        kind="kafka", bootstrap_servers=kafka_bootstrap, topic=names["batches_topic"],
        group_id=fresh_group, poll_timeout_s=0.5, idle_timeout_s=10.0))
    trainer_config.models = {"policy": ModelConfig(path=str(servers["student"][0]))}
    trainer_config.export.dir = None
    with StacxTrainer(trainer_config) as trainer:
        results = trainer.run(len(batches))
    assert sorted(r.batch_id for r in results) == sorted(b.batch_id for b in batches)
    assert all(math.isfinite(r.loss) and r.metrics["policy/nll"] > 0 for r in results)
