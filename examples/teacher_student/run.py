"""The teacher-student experiment in miniature: SFT, OPD, DAgger and AggreVaTe post-train a
student on the corridor task (corridor.py) from a trained teacher, under the same budget.

    .venv/bin/python examples/teacher_student/run.py [--seeds 3] [--out DIR]

Every strategy gets the same number of iterations, episodes per iteration (the teacher's for
SFT, the student's otherwise) and optimizer steps; the table also reports each strategy's
effective supervised tokens (loss-masked tokens trained on), which these equal budgets do not
equalise. The teacher is trained on the training tasks only; success is measured on the
held-out tasks, which no policy trains on. Rows are Trajectory records, packed by the
assembler's `pack_batch` into TrainingBatches and trained by StacxTrainer with the shipped
recipes `sft`, `opd`, `dagger`, `aggrevate`; DAgger rows come from `stacx.rollout.teacher.dagger_rows`.
Writes results.json, table.md and curves.png under --out and prints the table.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import corridor as cd
import numpy as np
import torch

from stacx.consumers.assembly.packing import PackedGroup, pack_batch
from stacx.rollout.teacher import BetaSchedule, dagger_rows
from stacx.schemas.records import (
    TrainingBatch,
    Trajectory,
    Turn,
    logprobs,
    loss_mask,
    token_ids,
    trajectory_id,
)
from stacx.trainer import InMemoryBatchSource, ModelConfig, StacxTrainer
from stacx.trainer.models import build_model
from stacx.trainer.testing import tiny_trainer_config

STRATEGIES = ("sft", "opd", "dagger", "aggrevate")
ITERATIONS = 10
EPISODES = 16
STEPS = 16
ROWS = 32
LR = 3e-3
Group = list[Trajectory]
TRAIN_TASKS = cd.tasks("train")
"""Tasks every policy trains on, the teacher included."""
HELDOUT_TASKS = cd.tasks("heldout")
"""Tasks only evaluation sees."""


def to_trajectory(e: cd.Episode, key: str, reward: float | None = None) -> Trajectory:
    """An episode as the rollout engine would publish it: prompt, then per turn the action (with
    the teacher's label) and the environment's answer."""
    turns = [Turn(role="user", text="", token_ids=token_ids(e.ids[:cd.PROMPT_LENGTH]))]
    for k, at in enumerate(e.actions):
        turns.append(Turn(role="assistant", text="", token_ids=token_ids([e.ids[at]]),
                          teacher_token_ids=token_ids([e.labels[k]]), actor=e.actors[k]))
        if at + 1 < len(e.ids):
            turns.append(Turn(role="tool", text="", token_ids=token_ids([e.ids[at + 1]])))
    mask = np.zeros(len(e.ids))
    mask[e.actions] = 1
    task = f"{e.x0}-{e.goal}"
    value = float(e.success) if reward is None else reward
    return Trajectory(trajectory_id=trajectory_id(task, key, 0, 0), group_id=key, sample_index=0,
                      task_id=task, task_type="corridor", model_name="student", policy_version=0,
                      turns=turns, token_ids=token_ids(e.ids), loss_mask=loss_mask(mask),
                      logprobs=logprobs(np.zeros(len(e.ids))), prompt_length=cd.PROMPT_LENGTH,
                      reward=value, rewards={"reward": value})


def replay(x0: int, goal: int, actions: list[int]) -> cd.Episode:
    e = cd.Episode.start((x0, goal))
    for a in actions:
        e.step(a)
    return e


def teacher_return(teacher: torch.nn.Module, e: cd.Episode) -> float:
    """Q*(s, a): success minus 0.1 per turn when the teacher finishes the episode."""
    if not e.done:
        e = _finish(teacher, e)
    return float(e.success) - 0.1 * len(e.actions)


def _finish(teacher: torch.nn.Module, e: cd.Episode) -> cd.Episode:
    gen = torch.Generator().manual_seed(0)
    while not e.done:
        e.step(cd.next_tokens(teacher, [e], greedy=True, gen=gen)[0])
    return e


# ----------------------------------------------------------------------------- data per strategy


def collect(strategy: str, student: torch.nn.Module, teacher: torch.nn.Module, it: int,
            rng: random.Random, gen: torch.Generator) -> list[Group]:
    """The groups one iteration adds, from EPISODES episodes."""
    picks = [rng.choice(TRAIN_TASKS) for _ in range(EPISODES)]
    key = f"{strategy}-{it}"
    if strategy == "sft":  # the teacher's own demonstrations
        episodes = cd.play(teacher, picks, greedy=True, gen=gen, teacher=teacher, beta=1.0)
        return [[to_trajectory(e, f"{key}-{k}")] for k, e in enumerate(episodes)]
    if strategy == "opd":  # the student's own samples; the trainer's teacher scores them
        episodes = cd.play(student, picks, greedy=False, gen=gen, teacher=teacher, beta=0.0)
        return [[to_trajectory(e, f"{key}-{k}")] for k, e in enumerate(episodes)]
    if strategy == "dagger":  # beta-mixed roll-in, teacher labels on every state
        beta = BetaSchedule(kind="exponential", beta0=1.0, decay=0.5)(it)
        episodes = cd.play(student, picks, greedy=False, gen=gen, teacher=teacher, beta=beta,
                           coin=rng)
        return [[row] for k, e in enumerate(episodes)
                for row in dagger_rows(to_trajectory(e, f"{key}-{k}"))]
    return aggrevate_groups(student, teacher, picks, key, rng, gen)


def aggrevate_groups(student: torch.nn.Module, teacher: torch.nn.Module,
                     picks: list[tuple[int, int]], key: str, rng: random.Random,
                     gen: torch.Generator) -> list[Group]:
    """Roll in with the student to a random turn t; try both actions there; the teacher
    finishes each; Q* is the reward of each row of the state's group."""
    groups = []
    for k, e in enumerate(cd.play(student, picks, greedy=False, gen=gen)):
        executed = [e.ids[at] for at in e.actions]
        t = rng.randrange(len(executed))
        prefix = [a for a in executed[:t] if a in (cd.LEFT, cd.RIGHT)]
        group = []
        for j, action in enumerate((cd.LEFT, cd.RIGHT)):
            branch = replay(e.x0, e.goal, prefix + [action])
            q = teacher_return(teacher, branch)
            row = cd.Episode.start((e.x0, e.goal))
            row.ids = branch.ids[:cd.PROMPT_LENGTH + 2 * len(prefix) + 1]
            row.actions, row.labels, row.actors = [len(row.ids) - 1], [action], ["student"]
            traj = to_trajectory(row, f"{key}-{k}", reward=q)
            traj.trajectory_id = trajectory_id(traj.task_id, f"{key}-{k}", j, 0)
            traj.sample_index = j
            group.append(traj)
        groups.append(group)
    return groups


# ----------------------------------------------------------------------------- training


def trainer_for(recipe: str, seed: int, teacher_dir: Path, lr: float = LR) -> StacxTrainer:
    models = {"policy": ModelConfig(tiny={}, seed=seed, attn_implementation="eager"),
              "teacher": ModelConfig(path=str(teacher_dir), attn_implementation="eager")}
    config = tiny_trainer_config(recipe, lr=lr, models=models, seed=seed)
    return StacxTrainer(config, source=InMemoryBatchSource([]))


def train_steps(trainer: StacxTrainer, data: list[Group], steps: int, rng: random.Random) -> int:
    """Train `steps` steps on up to ROWS rows each; returns the effective supervised tokens: the
    loss-masked tokens of every trained row (what a budget in tokens compares)."""
    tokens = 0
    for _ in range(steps):
        picked, rows = [], 0
        for group in rng.sample(data, len(data)):
            if rows + len(group) > ROWS:
                break
            picked.append(PackedGroup(group_id=group[0].group_id, trajectories=group))
            rows += len(group)
        batch = pack_batch(picked, model_name="student")
        trainer.train_step(batch)
        tokens += supervised_tokens(batch)
    return tokens


def supervised_tokens(batch: TrainingBatch) -> int:
    """Loss-masked tokens of a batch, the first token of each row excluded (it is never a
    target)."""
    mask = np.asarray(batch.loss_mask, dtype=np.float64)
    firsts = np.asarray(batch.offsets, dtype=np.int64)
    return int(mask.sum() - mask[firsts].sum())


def train_teacher(out: Path) -> Path:
    """A tiny policy trained on expert labels of noisy roll-outs of the training tasks only (the
    held-out tasks stay unseen by the teacher too): the teacher."""
    path = out / "teacher"
    if (path / "config.json").is_file():
        return path
    config = tiny_trainer_config("sft", lr=3e-3, models={"policy": ModelConfig(
        tiny={}, seed=100, attn_implementation="eager")})
    trainer = StacxTrainer(config, source=InMemoryBatchSource([]))
    rng = random.Random(100)
    data: list[Group] = []
    for k in range(400):
        e = cd.Episode.start(rng.choice(TRAIN_TASKS))
        while not e.done:
            label = cd.expert_action(e.x, e.goal)
            e.labels.append(label)
            e.actors.append("expert")
            e.step(label if rng.random() > 0.3 else rng.choice((cd.LEFT, cd.RIGHT)))
        data += [[row] for row in dagger_rows(to_trajectory(e, f"expert-{k}"))]
    train_steps(trainer, data, 300, rng)
    trainer.models["policy"].module.hf_module().save_pretrained(path)  # type: ignore[union-attr]
    return path



def run(strategy: str, seed: int, teacher_dir: Path,
        teacher: torch.nn.Module) -> tuple[list[float], int]:
    """(held-out success after each iteration (index 0: before training), effective supervised
    tokens trained on)."""
    torch.manual_seed(seed)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    trainer = trainer_for(strategy, seed, teacher_dir)
    student = trainer.models["policy"].module
    assert student is not None
    curve = [cd.success_rate(student, HELDOUT_TASKS)]
    data: list[Group] = []
    tokens = 0
    for it in range(ITERATIONS):
        new = collect(strategy, student, teacher, it, rng, gen)
        data = data + new if strategy in ("sft", "dagger") else new  # DAgger aggregates
        tokens += train_steps(trainer, data, STEPS, rng)
        curve.append(cd.success_rate(student, HELDOUT_TASKS))
    trainer.close()
    return curve, tokens


def table(results: dict[str, list[list[float]]], tokens: dict[str, list[int]],
          teacher_rate: float) -> str:
    lines = ["| strategy | held-out success (mean ± std over seeds) | per seed "
             "| supervised tokens (mean per seed) |", "|---|---|---|---|"]
    for s in STRATEGIES:
        finals = [c[-1] for c in results[s]]
        spread = statistics.stdev(finals) if len(finals) > 1 else 0.0
        lines.append(f"| {s} | {100 * statistics.mean(finals):.1f}% ± {100 * spread:.1f} | "
                     + ", ".join(f"{100 * f:.1f}%" for f in finals)
                     + f" | {round(statistics.mean(tokens[s])):,} |")
    lines.append(f"| teacher (trained on the training tasks) | {100 * teacher_rate:.1f}% | | |")
    return "\n".join(lines)


def plot(results: dict[str, list[list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for s in STRATEGIES:
        curves = np.array(results[s]) * 100
        x = np.arange(curves.shape[1]) * EPISODES
        ax.plot(x, curves.mean(0), label=s)
        ax.fill_between(x, curves.min(0), curves.max(0), alpha=0.15)
    ax.set_xlabel("episodes collected")
    ax.set_ylabel("held-out success (%)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("teacher-student-results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    teacher_dir = train_teacher(args.out)
    teacher = build_model(ModelConfig(path=str(teacher_dir), attn_implementation="eager")).eval()
    teacher_rate = cd.success_rate(teacher, HELDOUT_TASKS)
    runs = {s: [run(s, seed, teacher_dir, teacher) for seed in range(args.seeds)]
            for s in STRATEGIES}
    results = {s: [curve for curve, _ in runs[s]] for s in STRATEGIES}
    tokens = {s: [n for _, n in runs[s]] for s in STRATEGIES}
    text = table(results, tokens, teacher_rate)
    (args.out / "results.json").write_text(json.dumps(
        {"teacher": teacher_rate, "curves": results, "supervised_tokens": tokens,
         "iterations": ITERATIONS,
         "episodes_per_iteration": EPISODES, "steps_per_iteration": STEPS}, indent=1))
    (args.out / "table.md").write_text(text + "\n")
    plot(results, args.out / "curves.png")
    print(text)
    print(json.dumps({"seconds": round(time.monotonic() - started, 1),
                      **{s: statistics.mean(c[-1] for c in results[s]) for s in STRATEGIES}}))


if __name__ == "__main__":
    main()
