"""Benchmark: synchronous RL vs the asynchronous Kafka pipeline, under heavy-tailed tool latency.

The same GRPO workload runs twice for the same wall-clock budget:

* **sync**: sample a full batch (`prompts` x `group_size` episodes, all concurrently), wait for
  the slowest episode, train one step, repeat (what a synchronous trainer such as TRL does).
* **async**: `prompts` x `group_size` episodes are always in flight; each finished episode is
  published as a real `Trajectory` to a fresh Kafka topic (EventProducer); the trainer reads them
  back (EventConsumer), groups them by group id, drops groups older than `max_staleness` policy
  versions, and trains whenever `prompts` groups are ready. Rollouts pick up every new version.

Workload: `tasks` prompts, each with `actions` possible answers of which one is right (reward 1);
the policy is a softmax over answers per prompt (one logit table, the "weights"). An episode is
`turns` tool calls, each sleeping `min(10 s, 0.2 s x Pareto(1.5))` (median 0.32 s, mean 0.6 s,
p99 4.3 s, as in bench/peer_trl.py), then the answer. A training step is GRPO on the groups
(group mean/std advantages, PPO ratio clip 0.2 against the recorded logprob) plus `train_s` of
simulated accelerator time, the same in both modes. Reward after equal wall time is the policy's
expected success over all prompts (exact, no sampling noise).

    .venv/bin/python bench/async.py --json [--budget-s 60]

Last stdout line: JSON with both sides' trajectories/s (delivered to the trainer, and trained
on), trainer idle fraction, steps and final reward, and `async_over_sync`: trained trajectories/s
of async over sync (groups dropped as too stale do not count). Target: >= 2.5 at no worse reward.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stacx.consumers import EventConsumer  # noqa: E402
from stacx.producers import EventProducer  # noqa: E402
from stacx.schemas import topics  # noqa: E402
from stacx.schemas.records import Trajectory, logprobs, loss_mask, token_ids, trajectory_id  # noqa: E402

TARGET = 2.5


@dataclass(frozen=True, slots=True)
class Workload:
    tasks: int
    actions: int
    group_size: int
    prompts: int
    turns: int
    lr: float
    train_s: float
    max_staleness: int
    budget_s: float
    seed: int


@dataclass(slots=True)
class Sample:
    task: int
    action: int
    logprob: float
    reward: float
    version: int


@dataclass(slots=True)
class Policy:
    """Logits per task: the weights, replaced (never mutated) at every version."""

    logits: np.ndarray
    version: int = 0

    def probs(self, task: int) -> np.ndarray:
        z = np.exp(self.logits[task] - self.logits[task].max())
        return z / z.sum()

    def success(self, answers: np.ndarray) -> float:
        z = np.exp(self.logits - self.logits.max(axis=1, keepdims=True))
        p = z / z.sum(axis=1, keepdims=True)
        return float(p[np.arange(len(answers)), answers].mean())


@dataclass(slots=True)
class Meter:
    trajectories: int = 0
    trained: int = 0
    steps: int = 0
    idle_s: float = 0.0
    dropped_stale: int = 0
    rewards: list[float] = field(default_factory=list)


def tool_latency(rng: np.random.Generator) -> float:
    return float(min(10.0, 0.2 * (rng.pareto(1.5) + 1.0)))


async def episode(
    policy: Policy, task: int, answers: np.ndarray, w: Workload, rng: np.random.Generator
) -> Sample:
    version, probs = policy.version, policy.probs(task)  # the weights at the episode's start
    for _ in range(w.turns):
        await asyncio.sleep(tool_latency(rng))
    action = int(rng.choice(w.actions, p=probs))
    return Sample(task, action, float(np.log(probs[action])), float(action == answers[task]), version)


def train_step(policy: Policy, groups: list[list[Sample]], w: Workload) -> Policy:
    """GRPO: group-normalised advantages, clipped ratio against the behaviour logprob."""
    grad = np.zeros_like(policy.logits)
    count = sum(len(g) for g in groups)
    for group in groups:
        rewards = np.array([s.reward for s in group])
        adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        for s, a in zip(group, adv, strict=True):
            probs = policy.probs(s.task)
            ratio = probs[s.action] / np.exp(s.logprob)
            if (a > 0 and ratio > 1.2) or (a < 0 and ratio < 0.8):
                continue  # clipped: no gradient
            onehot = np.eye(w.actions)[s.action]
            grad[s.task] += a * ratio * (onehot - probs) / count
    time.sleep(w.train_s)  # the accelerator's share of a step, identical in both modes
    return Policy(policy.logits + w.lr * grad * len(groups), policy.version + 1)


def run_sync(w: Workload, answers: np.ndarray) -> dict[str, Any]:
    rng = np.random.default_rng(w.seed)
    policy, meter = Policy(np.zeros((w.tasks, w.actions))), Meter()
    start = time.monotonic()
    while time.monotonic() - start < w.budget_s:
        tasks = rng.choice(w.tasks, w.prompts, replace=False)
        rollout_start = time.monotonic()

        async def batch(p: Policy = policy, chosen: np.ndarray = tasks) -> list[Sample]:
            jobs = [episode(p, int(t), answers, w, rng) for t in chosen for _ in range(w.group_size)]
            return await asyncio.gather(*jobs)

        samples = asyncio.run(batch())
        meter.idle_s += time.monotonic() - rollout_start  # the trainer waits for the slowest
        meter.trajectories += len(samples)
        meter.rewards += [s.reward for s in samples]
        groups = [samples[i : i + w.group_size] for i in range(0, len(samples), w.group_size)]
        policy = train_step(policy, groups, w)
        meter.steps += 1
        meter.trained += len(samples)
    return _summary("sync", meter, policy, answers, time.monotonic() - start)


class AsyncPipeline:
    """Rollouts -> Kafka -> trainer, with weights handed back in process."""

    def __init__(self, w: Workload, answers: np.ndarray, bootstrap: str) -> None:
        self.w, self.answers, self.bootstrap = w, answers, bootstrap
        self.policy = Policy(np.zeros((w.tasks, w.actions)))
        self.meter = Meter()
        self.topic = f"bench.async.{uuid.uuid4().hex[:8]}"
        self.stop = threading.Event()

    def run(self) -> dict[str, Any]:
        _create_topic(self.bootstrap, self.topic)
        trainer = threading.Thread(target=self._train, daemon=True)
        start = time.monotonic()
        try:
            trainer.start()
            asyncio.run(self._rollouts(start))
            self.stop.set()
            trainer.join(timeout=60)
        finally:
            _delete_topic(self.bootstrap, self.topic)
        return _summary("async", self.meter, self.policy, self.answers, time.monotonic() - start)

    async def _rollouts(self, start: float) -> None:
        rng = np.random.default_rng(self.w.seed)
        config = EventProducer.Config(bootstrap_servers=self.bootstrap, client_id="bench-async", linger_ms=5)
        with EventProducer(config) as producer:
            slots = asyncio.Semaphore(self.w.prompts * self.w.group_size)
            running: set[asyncio.Task[None]] = set()
            group = 0
            while time.monotonic() - start < self.w.budget_s:
                task = int(rng.integers(self.w.tasks))
                for index in range(self.w.group_size):
                    await slots.acquire()
                    job = asyncio.create_task(self._one(producer, slots, rng, task, f"g{group}", index))
                    running.add(job)
                    job.add_done_callback(running.discard)
                group += 1
            for job in running:
                job.cancel()
            producer.flush(30)

    async def _one(
        self, producer: EventProducer, slots: asyncio.Semaphore, rng: np.random.Generator,
        task: int, group_id: str, index: int,
    ) -> None:  # fmt: skip
        try:
            sample = await episode(self.policy, task, self.answers, self.w, rng)
            record = _trajectory(sample, group_id, index)
            producer.publish(self.topic, record, key=group_id)
        finally:
            slots.release()

    def _train(self) -> None:
        config = EventConsumer.Config(
            bootstrap_servers=self.bootstrap, topics=[self.topic], group_id=f"bench-{uuid.uuid4().hex}",
            dlq_topic=None,
        )  # fmt: skip
        open_groups: dict[str, list[Sample]] = defaultdict(list)
        ready: list[list[Sample]] = []
        with EventConsumer(config) as consumer:
            waiting = time.monotonic()
            while not self.stop.is_set():
                for event in consumer.consume(500, timeout=0.05):
                    self._collect(event.key or "", event.value, open_groups, ready)
                if len(ready) < self.w.prompts:
                    continue
                self.meter.idle_s += time.monotonic() - waiting
                self.policy = train_step(self.policy, ready[: self.w.prompts], self.w)
                self.meter.trained += sum(len(g) for g in ready[: self.w.prompts])
                del ready[: self.w.prompts]
                self.meter.steps += 1
                waiting = time.monotonic()
            self.meter.idle_s += time.monotonic() - waiting

    def _collect(
        self, key: str, record: Trajectory, open_groups: dict[str, list[Sample]], ready: list[list[Sample]]
    ) -> None:
        sample = Sample(int(record.task_id), int(record.token_ids[-1]), float(record.logprobs[-1]),
                        record.reward, record.policy_version)  # fmt: skip
        self.meter.trajectories += 1
        self.meter.rewards.append(sample.reward)
        group = open_groups[key]
        group.append(sample)
        if len(group) < self.w.group_size:
            return
        del open_groups[key]
        if self.policy.version - min(s.version for s in group) > self.w.max_staleness:
            self.meter.dropped_stale += len(group)  # bounded staleness: too old to train on
            return
        ready.append(group)


def _trajectory(sample: Sample, group_id: str, index: int) -> Trajectory:
    return Trajectory(
        trajectory_id=trajectory_id(str(sample.task), group_id, index, sample.version),
        group_id=group_id,
        sample_index=index,
        task_id=str(sample.task),
        task_type="bench-async",
        model_name="bench-async",
        policy_version=sample.version,
        token_ids=token_ids([sample.task, sample.action]),
        loss_mask=loss_mask([0, 1]),
        logprobs=logprobs([0.0, sample.logprob]),
        prompt_length=1,
        reward=sample.reward,
    )


def _summary(name: str, meter: Meter, policy: Policy, answers: np.ndarray, wall_s: float) -> dict[str, Any]:
    return {
        "mode": name,
        "wall_s": round(wall_s, 1),
        "trajectories": meter.trajectories,
        "trajectories_per_s": round(meter.trajectories / wall_s, 2),
        "trained_trajectories_per_s": round(meter.trained / wall_s, 2),
        "steps": meter.steps,
        "trainer_idle_fraction": round(min(meter.idle_s / wall_s, 1.0), 3),
        "final_success": round(policy.success(answers), 3),
        "dropped_stale": meter.dropped_stale,
    }


def _create_topic(bootstrap: str, name: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, num_partitions=4, replication_factor=1)]).values():
        future.result(timeout=30)


def _delete_topic(bootstrap: str, name: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # referenced until the answer is in
    for future in admin.delete_topics([name]).values():
        try:
            future.result(timeout=30)
        except Exception as exc:  # best effort cleanup
            print(f"[bench.async] could not delete {name}: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON figure")
    parser.add_argument("--bootstrap", default=topics.default_bootstrap())
    parser.add_argument("--budget-s", type=float, default=60.0, help="wall-clock budget of each mode")
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--actions", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=8, help="groups per training step")
    parser.add_argument("--turns", type=int, default=2, help="tool calls per episode")
    parser.add_argument("--lr", type=float, default=2.0)
    parser.add_argument("--train-s", type=float, default=0.3, help="simulated accelerator time per step")
    parser.add_argument("--max-staleness", type=int, default=2, help="policy versions a group may lag")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    w = Workload(args.tasks, args.actions, args.group_size, args.prompts, args.turns, args.lr,
                 args.train_s, args.max_staleness, args.budget_s, args.seed)  # fmt: skip
    answers = np.random.default_rng(args.seed + 1).integers(0, w.actions, w.tasks)
    sync = run_sync(w, answers)
    print(f"[bench.async] sync: {json.dumps(sync)}", file=sys.stderr)
    pipeline = AsyncPipeline(w, answers, args.bootstrap).run()
    print(f"[bench.async] async: {json.dumps(pipeline)}", file=sys.stderr)
    # trajectories the trainer learned from (stale groups dropped by the async side do not count)
    ratio = pipeline["trained_trajectories_per_s"] / max(sync["trained_trajectories_per_s"], 1e-9)
    figure = {
        "async_over_sync": round(ratio, 2),
        "target": TARGET,
        "meets_target": ratio >= TARGET and pipeline["final_success"] >= sync["final_success"],
        "sync": sync,
        "async": pipeline,
        "settings": {k: v for k, v in vars(args).items() if k not in {"json", "bootstrap"}},
        "load_avg_1m": round(os.getloadavg()[0], 1),
    }
    print(json.dumps(figure))
    return 0


if __name__ == "__main__":
    sys.exit(main())
