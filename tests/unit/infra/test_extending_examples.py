"""docs/extending.md as a user reads it: each extension point's code, saved as the module its
config line names (`mypkg.<module>:<object>`), loads and works through the product's own
builders, and stays within 20 lines."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stacx.infra.cli import main
from stacx.rollout.data import build_task_set, task_samples
from stacx.rollout.protocols import ExecResult, TaskGroup
from stacx.rollout.rewards import get_reward, get_verifier
from stacx.rollout.scaffolds import build_scaffold
from stacx.rollout.scheduler import TaskScheduler
from stacx.schemas.records import TaskSample
from stacx.trainer import InMemoryBatchSource, StacxTrainer, get_recipe
from stacx.trainer.testing import synthetic_batch, tiny_trainer_config

DOC = Path(__file__).resolve().parents[3] / "docs" / "extending.md"
MAX_LINES = 20


def _sections() -> dict[str, str]:
    parts = re.split(r"^## ", DOC.read_text(), flags=re.M)[1:]
    return {part.splitlines()[0].strip(): part for part in parts}


def _examples() -> dict[str, tuple[str, str, str]]:
    """Section title -> (module, object, code) of every section with Python code."""
    found = {}
    for title, text in _sections().items():
        code = re.findall(r"```python\n(.*?)```", text, re.S)
        names = re.findall(r"mypkg\.(\w+):(\w+)", "".join(re.findall(r"```yaml\n(.*?)```", text, re.S)))
        if code:
            assert len(code) == 1 and names, f"{DOC.name}: section {title!r}: one code block, one config line"
            found[title] = (*names[0], code[0])
    return found


EXAMPLES = _examples()


@pytest.fixture
def mypkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """`mypkg` with every example saved as the module its config line names; point -> ref."""
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    for module, _, code in EXAMPLES.values():
        (tmp_path / "mypkg" / f"{module}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield {title.split(" (")[0]: f"mypkg.{m}:{o}" for title, (m, o, _) in EXAMPLES.items()}
    for name in [n for n in sys.modules if n == "mypkg" or n.startswith("mypkg.")]:
        del sys.modules[name]


def test_every_extension_point_with_code_is_shown_in_at_most_twenty_lines() -> None:
    titles = {title.split(" (")[0] for title in EXAMPLES}
    assert titles == {"Reward function", "Verifier", "Scaffold", "Task source",
                      "Scheduling strategy", "Recipe"}
    for title, (_, _, code) in EXAMPLES.items():
        assert len(code.splitlines()) <= MAX_LINES, f"{title}: {len(code.splitlines())} lines"


def test_the_entry_point_groups_named_are_those_stacx_plugins_lists(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plugins"])
    assert info.value.code == 0
    listed = set(re.findall(r"\(entry-point group (stacx\.\w+);", capsys.readouterr().out))
    named = set(re.findall(r"`(stacx\.\w+)`", _sections()["Entry points: a package that adds names"]))
    assert named == listed


def test_the_reward_verifier_and_strategy_examples_load(mypkg: dict[str, str]) -> None:
    score = get_reward(mypkg["Reward function"], {"partial": 0.1})
    assert score("4", {"answer": "5"}) == {"reward": 0.1, "answered": 1.0}
    assert score(None, {"answer": "5"})["reward"] == 0.0
    assert callable(get_verifier(mypkg["Verifier"]))
    config = TaskScheduler.Config(strategy=mypkg["Scheduling strategy"], strategy_options={"by": "prompt"})
    scheduler = TaskScheduler(config)
    for task_id, prompt in (("long", "a long prompt"), ("short", "hi")):  # the heads of two queues
        task = TaskSample(task_id=task_id, task_type=task_id, prompt=prompt)
        scheduler.push(TaskGroup(group_id=task_id, task=task, num_samples=1))
    first = scheduler.pop()
    assert first is not None and first.task.task_id == "short"


def test_the_scaffold_example_runs_a_tool_call_and_answers(mypkg: dict[str, str]) -> None:
    scaffold = build_scaffold(mypkg["Scaffold"], system_prompt="Be brief.")
    task = TaskSample(task_id="t", task_type="t", prompt="What is 6*7?")
    assert scaffold.initial_messages(task)[0] == {"role": "system", "content": "Be brief."}
    action = scaffold.parse("print(6*7)", finish_reason="stop")
    assert (action.kind, action.command, action.stdin) == ("exec", "python3 -", "print(6*7)")
    assert scaffold.observe(action, ExecResult(exit_code=0, stdout="42\n")).text == \
        "<tool_response>42\n</tool_response>"
    assert scaffold.parse("<answer>42</answer>", finish_reason="stop").answer == "42"


def test_the_task_source_example_reads_its_rows(mypkg: dict[str, str], tmp_path: Path) -> None:
    rows = [{"task_id": f"t{i}", "task_type": "default", "prompt": f"Say {i}.", "data": {"answer": str(i)}}
            for i in range(5)]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    source = build_task_set(mypkg["Task source"], {"path": str(path), "num_heldout": 2})
    train = task_samples(source.train_tasks(), where="train")
    assert [t.task_id for t in train] == ["t2", "t3", "t4"] and json.loads(train[0].data) == {"answer": "2"}
    assert [t.task_id for t in task_samples(source.heldout_tasks(), where="heldout")] == ["t0", "t1"]


def test_the_recipe_example_trains_and_its_metric_is_logged(
        mypkg: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    ref = mypkg["Recipe"]
    assert [role.name for role in get_recipe(ref).roles] == ["policy"]
    trainer = StacxTrainer(tiny_trainer_config(ref), source=InMemoryBatchSource([synthetic_batch(0)]))
    with caplog.at_level(logging.INFO, logger="stacx.trainer.engine"):
        (result,) = trainer.run(1)
    assert result.metrics["policy/weighted_sft/scale"] == 0.5
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step 1 ")]
    assert line.endswith(" policy/weighted_sft/scale=0.5") or " policy/weighted_sft/scale=0.5 " in line
