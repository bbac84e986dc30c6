"""A user's own code in a real `stacx run`: nothing of it lives in this repository.

Two packages are written outside the repo, as a user would:

- `plugacc` (a folder named by `pipeline.plugin_paths`, so every service imports it from there):
  a task source, a scaffold, a reward with an option, and a recipe whose specialization returns
  a metric of its own, each named by dotted path;
- `plugacc-ep` (a real pyproject package, pip-installed with no index into a throwaway venv
  layered on ours): a reward that a config names only by its `stacx.rewards` entry point.

The run starts from that layer's interpreter, so the entry point must reach every service it
spawns. Kafka must be up (`stacx infra up`; `make test` does it). The run is short (two policy
versions of the tiny model); it checks that each plug-in was used where it belongs: the task ids
and scaffold marks on the trajectories read back from the run's topic, both rewards' components
on them, the recipe's metric in the trainer's log, the entry point in `stacx plugins`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_port
from run_names import run_name

from stacx.consumers.assembly.claims import decode_trajectory
from stacx.consumers.replay import ReplayRange, read_range
from stacx.schemas.records import Trajectory

STEPS = 2
NUM_TASKS = 8
RUN_TIMEOUT_S = 780

USER_PACKAGE = {
    "plugacc/__init__.py": "",
    "plugacc/tasks.py": '''
class CountingTasks:
    """Tasks of two types: one per evaluator (a task's type picks its evaluator)."""

    def __init__(self, *, num_tasks: int = 4) -> None:
        self.num_tasks = num_tasks

    def train_tasks(self) -> list[dict]:
        kinds = ("plugacc_local", "plugacc_entry")
        return [{"task_id": f"plugacc-{i:03d}", "task_type": kinds[i % 2], "prompt": f"Say {i}.",
                 "data": {"answer": str(i)}} for i in range(self.num_tasks)]
''',
    "plugacc/agent.py": '''
from stacx.rollout.protocols import Action, Observation


class Echo:
    """One turn, no sandbox: the whole completion is the answer, marked as this scaffold's."""

    name = "plugacc-echo"
    needs_sandbox = False
    stop: list[str] = []

    def initial_messages(self, task):
        return [{"role": "user", "content": task.prompt}]

    def parse(self, text: str, *, finish_reason: str) -> Action:
        return Action(kind="answer", answer="plugacc:" + text)

    def observe(self, action, result) -> Observation:
        return Observation(text="")
''',
    "plugacc/rewards.py": '''
def score(answer, data, *, weight: float = 1.0):
    marked = answer is not None and answer.startswith("plugacc:")
    return {"reward": weight * float(marked and str(data["answer"]) in answer),
            "plugacc_marked": float(marked)}
''',
    "plugacc/recipes.py": '''
from dataclasses import dataclass

from stacx.trainer.recipe import ModelSlot, Role, TrainingConfig
from stacx.trainer.recipes.grpo import GRPO


@dataclass(kw_only=True, slots=True)
class MarkedGRPO(GRPO):
    def compute_loss(self, outputs, batch):
        loss, metrics = GRPO.compute_loss(self, outputs, batch)
        return loss, {**metrics, "plugacc_marker": 7.0}


def marked_grpo() -> TrainingConfig:
    """GRPO without a reference, with a metric of its own."""
    return TrainingConfig(models=[ModelSlot(name="policy")],
                          roles=[Role(name="policy", specialization=MarkedGRPO(kl_beta=0.0))])
''',
}

ENTRY_POINT_PACKAGE = {
    "pyproject.toml": '''
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "plugacc-ep"
version = "0.1.0"

[project.entry-points."stacx.rewards"]
plugacc_length = "plugacc_ep.rewards:length"
''',
    "src/plugacc_ep/__init__.py": "",
    "src/plugacc_ep/rewards.py": '''
def length(answer, data):
    """Reward for an even answer length; the length as a component."""
    text = answer or ""
    return {"reward": float(len(text) % 2 == 0), "plugacc_length": float(len(text))}
''',
}


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.lstrip("\n"))
    return root


def _venv_layer(root: Path) -> Path:
    """A throwaway venv whose site-packages chains into ours (as `make setup` chains .venv into
    the shared one): what pip installs there is seen by its interpreter only. Its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    Path(purelib, "_stacx_base.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return python


def _pip_install(python: Path, package: Path) -> None:
    """`pip install` with no index and no build isolation (setuptools is ours): no network."""
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
         "--no-deps", "--no-build-isolation", str(package)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _env() -> dict[str, str]:
    """Our environment without PYTHONPATH: only `pipeline.plugin_paths` may bring `plugacc`."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _config(name: str, runs_dir: Path, bootstrap: str) -> dict[str, Any]:
    evaluator = {"scaffold": "plugacc.agent:Echo", "max_turns": 1, "max_tokens": 64, "max_new_tokens": 8}
    return {
        "bootstrap_servers": bootstrap,
        "pipeline": {
            "name": name,
            "runs_dir": str(runs_dir),
            "steps": STEPS,
            "timeout_s": RUN_TIMEOUT_S - 120,
            "live": False,
            "plugin_paths": ["userpkg"],  # relative to this file
            "tasks": {"source": "plugacc.tasks:CountingTasks", "options": {"num_tasks": NUM_TASKS}},
            "model": {"tiny": {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "num_key_value_heads": 2, "seed": 0}},
            "evaluation": {"every_versions": 0, "final_samples_per_problem": 0},
        },
        # the run's own ports; no sandbox is used (the scaffold needs none)
        "gateway": {"port": free_port(), "backend": "process", "sessions": {"warm_pool_size": 0}},
        "inference": {"server": {"port": free_port(), "engine": {"max_batch_size": 16}}},
        "rollout": {
            "data": {"samples_per_task": 4, "epochs": 0, "shuffle": True, "seed": 0},
            "manager": {
                "max_concurrent_episodes": 8,
                "max_staleness": 1,
                "train_groups_per_version": 2,
                "pool": {"cpu": 8, "memory_mb": 4096, "generations": 16, "gpus": 0},
                "evaluators": {
                    "plugacc_local": {**evaluator, "reward": "plugacc.rewards:score",
                                      "reward_options": {"weight": 2.0}},
                    "plugacc_entry": {**evaluator, "reward": "plugacc_length"},
                },
            },
        },
        "assembler": {
            "grouping": {"group_size": 4, "group_timeout_s": 60.0, "partial_policy": "emit"},
            "filtering": {"max_staleness": 2, "ok_statuses": ["COMPLETED", "TRUNCATED"]},
            "mixture": {"batch_size": 2, "batch_unit": "groups"},
        },
        "trainer": {
            "recipe": "plugacc.recipes:marked_grpo",
            "optimizer": {"lr": 0.0007, "warmup_steps": 0},
            "backend": {"kind": "fsdp2", "world_size": 2, "device": "cpu"},
            "checkpoint": {"every_steps": 5},
            "export": {"every_steps": 1, "keep_last": 3},
        },
    }


def _stacx(python: Path, *args: str, cwd: Path, log: Path, timeout_s: float) -> int:
    """`stacx ARGS` by the layer's interpreter; on a timeout it is stopped like a user's ^C
    (SIGTERM: the run stops its services) and the test fails."""
    with log.open("wb") as out:
        proc = subprocess.Popen([str(python), "-m", "stacx.infra.cli", *args], cwd=cwd, env=_env(),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"stacx {' '.join(args)} ran past {timeout_s:.0f}s:\n{_tail(log)}")


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def _service_logs(logs: Path) -> str:
    """The tail of every service's log (a run that failed or stalled: which service stopped)."""
    return "".join(f"\n--- {p.name}\n{_tail(p, 25)}" for p in sorted(logs.glob("*.log")))


def _trajectories(bootstrap: str, topic: str) -> list[Trajectory]:
    return [decode_trajectory(r.value) for r in read_range(bootstrap, ReplayRange(topic=topic))]


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_a_run_uses_a_users_task_source_scaffold_rewards_and_recipe(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    _write(tmp_path / "userpkg", USER_PACKAGE)
    python = _venv_layer(tmp_path / "layer")
    _pip_install(python, _write(tmp_path / "plugacc-ep", ENTRY_POINT_PACKAGE))

    listing = tmp_path / "plugins.out"
    assert _stacx(python, "plugins", "rewards", cwd=tmp_path, log=listing, timeout_s=120) == 0, _tail(listing)
    listed = (r"^  plugacc_length +entry point stacx\.rewards of plugacc-ep \(plugacc_ep\.rewards:length\)"
              r"  Reward for an even answer length; the length as a component\.$")  # origin, then its summary
    assert re.search(listed, listing.read_text(), re.M), listing.read_text()

    config = tmp_path / "plugins.yaml"
    name = run_name("plugins")
    config.write_text(yaml.safe_dump(_config(name, tmp_path / "runs", kafka_bootstrap), sort_keys=False))
    output = tmp_path / "run.out"
    code = _stacx(python, "run", str(config), cwd=tmp_path, log=output, timeout_s=RUN_TIMEOUT_S)
    root = tmp_path / "runs" / name
    assert code == 0, f"{_tail(output)}{_service_logs(root / 'logs')}"

    report = json.loads((root / "report.json").read_text())
    assert report["status"] == "ok" and report["policy_versions"] >= STEPS

    trajectories = _trajectories(kafka_bootstrap, f"stacx.trajectories.{report['run_id']}")
    by_type: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        by_type.setdefault(t.task_type, []).append(t)
    assert sorted(by_type) == ["plugacc_entry", "plugacc_local"], sorted(by_type)
    assert {t.task_id for t in trajectories} <= {f"plugacc-{i:03d}" for i in range(NUM_TASKS)}
    for t in trajectories:  # the scaffold's mark, on every trajectory
        assert t.metadata["scaffold"] == "plugacc-echo" and t.metadata["answer"].startswith("plugacc:")
    for t in by_type["plugacc_local"]:  # the dotted-path reward, its option bound
        assert sorted(t.rewards) == ["plugacc_marked", "reward"] and t.rewards["plugacc_marked"] == 1.0
        assert t.reward in (0.0, 2.0) and t.reward == t.rewards["reward"]
    for t in by_type["plugacc_entry"]:  # the entry-point reward
        assert sorted(t.rewards) == ["plugacc_length", "reward"]
        assert t.rewards["plugacc_length"] == len(t.metadata["answer"])

    steps = [line for line in (root / "logs" / "trainer.log").read_text().splitlines()
             if " stacx.trainer.engine: step " in line]
    assert len(steps) >= STEPS, steps
    assert all(" policy/plugacc_marker=7 " in f"{line} " for line in steps), steps
