"""The acceptance battery of bad pipeline configs: each one (every kind of mistake a user makes,
in every section) is refused by `stacx run --explain` in one pass, exit status 2, every line
naming the file and the field path, no traceback; and plain `stacx run` refuses each before any
service, run directory or broker probe.

Each case is the quickstart with one mistake (a few with two, in one section, to show that
one does not hide the other); `FIELDS` are the field paths its lines must name."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from stacx.infra.cli import main

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
EVALUATOR = ("rollout", "manager", "evaluators", "arithmetic_tool")

Tree = dict[str, Any]


@dataclass(frozen=True)
class Case:
    name: str
    mutate: Callable[[Tree, Path], None]
    fields: tuple[str, ...]
    """Field paths the lines must name (one line at least each)."""
    says: str = ""
    """Text one of the lines must hold (the fix, the close match)."""


def _set(*path: str, value: Any) -> Callable[[Tree, Path], None]:
    def mutate(tree: Tree, tmp: Path) -> None:
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value

    return mutate


def _both(*mutations: Callable[[Tree, Path], None]) -> Callable[[Tree, Path], None]:
    def mutate(tree: Tree, tmp: Path) -> None:
        for one in mutations:
            one(tree, tmp)

    return mutate


def _drop(*path: str) -> Callable[[Tree, Path], None]:
    def mutate(tree: Tree, tmp: Path) -> None:
        node = tree
        for part in path[:-1]:
            node = node[part]
        del node[path[-1]]

    return mutate


def _tasks(value: Any) -> Callable[[Tree, Path], None]:
    """Replace the task source (and drop the SFT stage, which needs the source's demonstrations)."""

    def mutate(tree: Tree, tmp: Path) -> None:
        tree["pipeline"]["tasks"] = value(tmp) if callable(value) else value
        tree["pipeline"].pop("sft", None)

    return mutate


def _bad_jsonl(tmp: Path) -> dict[str, str]:
    rows = ['{"task_id": "a", "task_type": "t", "prompt": "p"}', '{"task_id": "b"}', "not json", "",
            '{"task_id": "c", "task_type": "t", "prompt": "p", "answr": 1}']
    (tmp / "tasks.jsonl").write_text("\n".join(rows) + "\n")
    return {"jsonl": str(tmp / "tasks.jsonl")}


BAD_SOURCE = """\
class Tasks:
    def train_tasks(self):
        return [{"task_id": "a", "task_type": "t", "prompt": "p"}, {"task_id": "b"}, 7]
"""


def _bad_source(tmp: Path) -> dict[str, str]:
    (tmp / "badsource.py").write_text(BAD_SOURCE)
    return {"source": f"{tmp / 'badsource.py'}:Tasks"}


def _file(text: str) -> Callable[[Tree, Path], None]:
    def mutate(tree: Tree, tmp: Path) -> None:
        tree.clear()
        tree["__text__"] = text

    return mutate


CASES = [
    # -- the file itself
    Case("yaml_syntax", _file("pipeline: {steps: 2\n"), (), "is not valid YAML: line 2"),
    Case("empty_file", _file(""), (), "is empty"),
    Case("not_a_mapping", _file("- pipeline\n"), (), "must be a mapping of sections"),
    Case("unknown_section", _set("trainr", value={}), ("trainr",), "did you mean 'trainer'?"),
    # -- pipeline:
    Case("steps_zero", _set("pipeline", "steps", value=0), ("pipeline.steps",)),
    Case("run_name", _set("pipeline", "name", value="my run!"), ("pipeline.name",)),
    Case("timeout_negative", _set("pipeline", "timeout_s", value=-1), ("pipeline.timeout_s",)),
    Case("stall_timeout_zero", _set("pipeline", "stall_timeout_s", value=0), ("pipeline.stall_timeout_s",)),
    Case("model_path_and_tiny", _set("pipeline", "model", "path", value="/models/x"), ("pipeline.model",)),
    Case("model_path_missing", _set("pipeline", "model", value={"path": "/nonexistent/model"}),
         ("pipeline.model.path",)),
    Case("tiny_width_zero", _set("pipeline", "model", "tiny", "hidden_size", value=0),
         ("pipeline.model.tiny.hidden_size",)),
    Case("no_task_kind", _tasks({}), ("pipeline.tasks",), "set exactly one of"),
    Case("task_source_module", _set("pipeline", "tasks", "source", value="nopkg_xyz.tasks:Tasks"),
         ("pipeline.tasks.source",), "module 'nopkg_xyz' not found"),
    Case("task_source_options", _set("pipeline", "tasks", "options", "num_trian", value=3),
         ("pipeline.tasks.source",), "options do not fit"),
    Case("tasks_jsonl_missing", _tasks({"jsonl": "/nonexistent/tasks.jsonl"}), ("pipeline.tasks.jsonl",)),
    Case("tasks_jsonl_rows", _tasks(_bad_jsonl), ("pipeline.tasks.jsonl",), "tasks.jsonl:5: unknown field"),
    Case("task_source_rows", _tasks(_bad_source), ("pipeline.tasks.source",), "task 2: a int, not a mapping"),
    Case("sft_lr", _set("pipeline", "sft", "lr", value=-1.0), ("pipeline.sft.lr",)),
    Case("sft_batch", _set("pipeline", "sft", "batch_size", value=0), ("pipeline.sft.batch_size",)),
    Case("eval_problems", _set("pipeline", "evaluation", "num_problems", value=0),
         ("pipeline.evaluation.num_problems",)),
    Case("eval_unknown", _set("pipeline", "evaluation", "num_problem", value=3),
         ("pipeline.evaluation.num_problem",), "did you mean 'num_problems'?"),
    Case("plugin_paths_type", _set("pipeline", "plugin_paths", value="examples"), ("pipeline.plugin_paths",)),
    Case("tracker_typo", _set("pipeline", "tracking", value=["tensorbord"]),
         ("pipeline.tracking.trackers.0",), "did you mean 'tensorboard'?"),
    Case("tracker_options",
         _set("pipeline", "tracking", value=[{"name": "tensorboard", "options": {"x": 1}}]),
         ("pipeline.tracking.trackers.0",), "options do not fit"),
    Case("tracker_module", _set("pipeline", "tracking", value=["nopkg_xyz.trackers:Csv"]),
         ("pipeline.tracking.trackers.0",)),
    Case("success_reward_type", _set("pipeline", "tracking", value={"success_reward": "high"}),
         ("pipeline.tracking.success_reward",)),
    Case("restarts_negative", _set("pipeline", "services", "restarts", "max_restarts", value=-1),
         ("pipeline.services.restarts.max_restarts",)),
    Case("moved_field", _set("pipeline", "services", "gateway_port", value=8711),
         ("pipeline.services.gateway_port",), "set gateway.port"),
    Case("failed_fraction", _set("pipeline", "max_failed_fraction", value=1.5),
         ("pipeline.max_failed_fraction",)),
    Case("replication_zero", _set("topics", "replication_factor", value=0), ("topics.replication_factor",)),
    # -- gateway:
    Case("gateway_port", _set("gateway", "port", value=70000), ("gateway.port",)),
    Case("gateway_unknown", _set("gateway", "prot", value=1), ("gateway.prot",), "did you mean 'port'?"),
    Case("gateway_pool_type", _set("gateway", "sessions", "warm_pool_size", value="many"),
         ("gateway.sessions.warm_pool_size",)),
    Case("gateway_auth_type", _set("gateway", "auth", value="maybe"), ("gateway.auth",)),
    # -- inference:
    Case("inference_port", _set("inference", "server", "port", value=-1), ("inference.server.port",)),
    Case("engine_module", _set("inference", "engine", value="nopkg_xyz.engine:Engine"), ("inference.engine",),
         "module 'nopkg_xyz' not found"),
    Case("engine_typo", _set("inference", "engine", value="sglnag"), ("inference.engine",),
         "did you mean 'sglang'?"),
    Case("servers_zero", _set("inference", "servers", value=0), ("inference.servers",)),
    Case("threads_type", _set("inference", "server", "torch_threads", value="two"),
         ("inference.server.torch_threads",)),
    # -- rollout:
    Case("temperature", _set(*EVALUATOR, "temperature", value=-0.5), (".".join(EVALUATOR) + ".temperature",)),
    Case("top_p", _set(*EVALUATOR, "top_p", value=0.0), (".".join(EVALUATOR) + ".top_p",)),
    Case("max_turns", _set(*EVALUATOR, "max_turns", value=0), (".".join(EVALUATOR) + ".max_turns",)),
    Case("max_new_tokens_type", _set(*EVALUATOR, "max_new_tokens", value="lots"),
         (".".join(EVALUATOR) + ".max_new_tokens",)),
    Case("episode_timeout", _set(*EVALUATOR, "episode_timeout_s", value=-1),
         (".".join(EVALUATOR) + ".episode_timeout_s",)),
    Case("scaffold_typo", _set(*EVALUATOR, "scaffold", value="retol"), (".".join(EVALUATOR) + ".scaffold",),
         "did you mean 'retool'?"),
    Case("reward_module", _set(*EVALUATOR, "reward", value="nopkg_xyz.rewards:score"),
         (".".join(EVALUATOR) + ".reward",)),
    Case("reward_attribute", _set(*EVALUATOR, "reward", value="quickstart.arithmetic:scor"),
         (".".join(EVALUATOR) + ".reward",), "has no attribute 'scor'"),
    Case("reward_file", _set(*EVALUATOR, "reward", value="/nonexistent/rewards.py:score"),
         (".".join(EVALUATOR) + ".reward",), "not found"),
    Case("reward_options", _set(*EVALUATOR, "reward_options", value={"bonus": 1}),
         (".".join(EVALUATOR) + ".reward",)),
    Case("evaluator_unknown", _set(*EVALUATOR, "temprature", value=0.7),
         (".".join(EVALUATOR) + ".temprature",), "did you mean 'temperature'?"),
    Case("strategy_typo", _set("rollout", "manager", "scheduler", "strategy", value="fifoo"),
         ("rollout.manager.scheduler.strategy",), "did you mean 'fifo'?"),
    Case("samples_per_task", _set("rollout", "data", "samples_per_task", value=0),
         ("rollout.data.samples_per_task",), "expected greater than 0"),
    Case("group_size_zero", _set("assembler", "grouping", "group_size", value=0),
         ("assembler.grouping.group_size",), "expected greater than 0"),
    Case("concurrency_zero", _set("rollout", "manager", "max_concurrent_episodes", value=0),
         ("rollout.manager.max_concurrent_episodes",)),
    Case("request_timeout", _set("rollout", "sandbox", "request_timeout_s", value=0),
         ("rollout.sandbox.request_timeout_s",)),
    Case("owned_url", _set("rollout", "inference", "url", value="http://127.0.0.1:1"),
         ("rollout.inference.url",)),
    Case("pool_type", _set("rollout", "manager", "pool", "sandboxes", value="x"),
         ("rollout.manager.pool.sandboxes",)),
    # -- assembler:
    Case("group_size", _set("assembler", "grouping", "group_size", value=7),
         ("assembler.grouping.group_size", "rollout.data.samples_per_task")),
    Case("group_timeout_type", _set("assembler", "grouping", "group_timeout_s", value="soon"),
         ("assembler.grouping.group_timeout_s",)),
    Case("ok_statuses", _set("assembler", "filtering", "ok_statuses", value=["DONE"]),
         ("assembler.filtering.ok_statuses.0",)),
    Case("staleness_type", _set("assembler", "filtering", "max_staleness", value="old"),
         ("assembler.filtering.max_staleness",)),
    # -- trainer:
    Case("recipe_typo", _set("trainer", "recipe", value="grpp"), ("trainer.recipe",), "did you mean 'grpo'?"),
    Case("lr_negative", _set("trainer", "optimizer", "lr", value=-1.0), ("trainer.optimizer.lr",)),
    Case("warmup_negative", _set("trainer", "optimizer", "warmup_steps", value=-1),
         ("trainer.optimizer.warmup_steps",)),
    Case("device_choice", _set("trainer", "backend", "device", value="tpu"), ("trainer.backend.device",)),
    Case("world_size_zero", _set("trainer", "backend", "world_size", value=0),
         ("trainer.backend.world_size",)),
    Case("role_option_typo", _set("trainer", "role_options", value={"policy": {"kl_bta": 0.1}}),
         ("trainer.role_options.policy.kl_bta",), "did you mean 'kl_beta'?"),
    Case("role_option_type", _set("trainer", "role_options", value={"policy": {"kl_beta": "x"}}),
         ("trainer.role_options.policy.kl_beta",)),
    Case("role_option_value", _set("trainer", "role_options", value={"policy": {"kl_estimator": "k9"}}),
         ("trainer.role_options.policy.kl_estimator",)),
    Case("role_unknown", _set("trainer", "role_options", value={"critik": {}}),
         ("trainer.role_options.critik",)),
    Case("role_options_type", _set("trainer", "role_options", value={"policy": 3}),
         ("trainer.role_options.policy",)),
    Case("owned_max_steps", _set("trainer", "max_steps", value=5), ("trainer.max_steps",), "pipeline.steps"),
    Case("checkpoint_type", _set("trainer", "checkpoint", "every_steps", value="often"),
         ("trainer.checkpoint.every_steps",)),
    # -- two mistakes in one section: the type error does not hide what the section names
    Case("recipe_and_type", _both(_set("trainer", "recipe", value="grpp"), _set("trainer", "optimizer", "lr",
                                                                            value="fast")),
         ("trainer.recipe", "trainer.optimizer.lr")),
    Case("reward_and_type", _both(_set(*EVALUATOR, "reward", value="nopkg_xyz.r:s"),
                                  _set(*EVALUATOR, "max_turns", value="x")),
         (".".join(EVALUATOR) + ".reward", ".".join(EVALUATOR) + ".max_turns")),
    Case("role_options_and_type", _both(_set("trainer", "role_options", value={"policy": {"kl_bta": 0.1}}),
                                        _set("trainer", "seed", value="one")),
         ("trainer.role_options.policy.kl_bta", "trainer.seed")),
]


def _write(case: Case, tmp_path: Path) -> Path:
    tree = copy.deepcopy(QUICKSTART)
    tree["pipeline"]["plugin_paths"] = [str(REPO / "examples")]
    case.mutate(tree, tmp_path)
    path = tmp_path / f"{case.name}.yaml"
    text = tree.pop("__text__", None)
    path.write_text(text if text is not None else yaml.safe_dump(tree, sort_keys=False))
    return path


class ReachedAStart(AssertionError):
    """A bad config got past validation to something that starts or touches a service."""


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every way a run begins (its directory, a service process, the broker probe) fails the test."""
    from stacx.infra.pipeline import orchestrator, preflight, services

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ReachedAStart("a bad config reached a service start")

    monkeypatch.setattr(services.ServiceProcess, "start", refuse)
    monkeypatch.setattr(orchestrator.Pipeline, "_prepare_run_dir", refuse)
    monkeypatch.setattr(preflight, "_kafka_problem", refuse)
    monkeypatch.setattr(preflight, "accelerator_problems", refuse)
    yield


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def _fields(path: Path, err: str) -> list[str]:
    """The field paths of each line: `stacx run: FILE: FIELD: why`, where FIELD may be
    `field=value` or, for values that must agree, `field=value, field=value`."""
    prefix = f"stacx run: {path}: "
    heads = [line.removeprefix(prefix).split(": ", 1)[0] for line in err.splitlines()]
    return [part.split("=", 1)[0] for head in heads for part in head.split(", ")]


def test_the_battery_has_every_kind_and_at_least_sixty_configs() -> None:
    assert len(CASES) >= 60 and len({c.name for c in CASES}) == len(CASES)
    sections = {c.fields[0].split(".")[0] for c in CASES if c.fields}
    assert {"pipeline", "gateway", "inference", "rollout", "assembler", "trainer", "topics"} <= sections


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_bad_config_is_refused_by_explain_in_one_pass_with_file_and_field(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str], nothing_starts: None
) -> None:
    path = _write(case, tmp_path)
    status, out, err = _refused(["run", str(path), "--explain"], capsys)
    assert status == 2, f"exit {status}\n{out}{err}"
    assert "Traceback" not in out + err and out == ""
    lines = err.splitlines()
    assert lines and all(str(path) in line for line in lines), err  # every line names the file
    fields = _fields(path, err)
    for field in case.fields:
        assert field in fields, f"{field} not among {fields}\n{err}"
    assert case.says in err, err


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_plain_run_refuses_each_before_anything_starts(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str], nothing_starts: None
) -> None:
    path = _write(case, tmp_path)
    status, out, err = _refused(["run", str(path), "--no-live"], capsys)
    assert status == 2, f"exit {status}\n{out}{err}"
    assert "Traceback" not in out + err and not (tmp_path / "runs").exists()


def test_mistakes_in_every_section_are_all_reported_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], nothing_starts: None
) -> None:
    """One file with a mistake per case of distinct field: every one is a line of the one report."""
    overwriting = {"model_path_and_tiny", "model_path_missing", "no_task_kind", "tasks_jsonl_missing",
                   "tasks_jsonl_rows", "task_source_rows", "unknown_section", "role_option_type",
                   "role_option_value", "role_unknown", "role_options_type"}  # another case's value
    chosen = [c for c in CASES if c.fields and c.name not in overwriting]
    chosen = [c for c in chosen if not any(o is not c and set(o.fields) & set(c.fields) for o in chosen)]
    everything = Case("everything", _both(*(c.mutate for c in chosen)), ())
    path = _write(everything, tmp_path)
    status, _, err = _refused(["run", str(path), "--explain"], capsys)
    assert status == 2 and "Traceback" not in err
    fields = _fields(path, err)
    missing = [f for c in chosen for f in c.fields if f not in fields]
    assert len(chosen) >= 30 and not missing, f"{missing} not reported:\n{err}"


def test_the_real_command_refuses_all_at_once_without_a_traceback(tmp_path: Path) -> None:
    """The same, through the installed `stacx` in its own process (its logging, its exit path)."""
    import subprocess
    import sys

    chosen = [c for c in CASES if c.name in ("temperature", "lr_negative", "gateway_port", "reward_and_type",
                                             "role_option_typo", "engine_module", "tracker_typo")]
    path = _write(Case("several", _both(*(c.mutate for c in chosen)), ()), tmp_path)
    done = subprocess.run([sys.executable, "-m", "stacx.infra.cli", "run", str(path), "--explain"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert "Traceback" not in done.stderr
    fields = _fields(path, done.stderr)
    assert all(f in fields for c in chosen for f in c.fields), done.stderr
