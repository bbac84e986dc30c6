"""`stacx run --explain` (the real command, in its own process) reports every problem of every
section at once: one line each, with its field path, exit status 2, no traceback."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())


def _explain(tree: dict[str, Any], tmp_path: Path) -> tuple[int, list[str], str]:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    done = subprocess.run(
        [sys.executable, "-m", "stacx.infra.cli", "run", str(path), "--explain"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    prefix = f"stacx run: {path}: "
    lines = [line.removeprefix(prefix) for line in done.stderr.splitlines() if line.strip()]
    return done.returncode, lines, done.stdout + done.stderr


def _quickstart() -> dict[str, Any]:
    tree = copy.deepcopy(QUICKSTART)
    tree["pipeline"]["plugin_paths"] = [str(REPO / "examples")]
    return tree


def test_five_errors_in_four_sections_are_five_lines_with_their_field_paths(tmp_path: Path) -> None:
    tree = _quickstart()
    tree["pipeline"]["steps"] = 0  # pipeline: a value
    tree["trainer"]["optimizer"]["lr"] = "fast"  # trainer: a type
    tree["trainer"]["backend"]["device"] = "tpu"  # trainer: a choice
    tree["assembler"]["grouping"]["group_timeout_s"] = "soon"  # assembler: a type
    tree["rollout"]["manager"]["evaluators"]["arithmetic_tool"]["scaffold"] = "termnal"  # rollout: a name
    status, lines, output = _explain(tree, tmp_path)
    assert status == 2, output
    assert "Traceback" not in output
    fields = sorted(line.split(": ", 1)[0] for line in lines)
    assert fields == [
        "assembler.grouping.group_timeout_s",
        "pipeline.steps",
        "rollout.manager.evaluators.arithmetic_tool.scaffold",
        "trainer.backend.device",
        "trainer.optimizer.lr",
    ], output
    assert any("'termnal' is not a known scaffold; use one of ['retool'" in line for line in lines)
    assert any(line.startswith("trainer.optimizer.lr: expected a valid number, got 'fast'") for line in lines)


BROKEN = {
    "__init__.py": "",
    "rewards.py": "def two(answer):\n    return {'reward': 0.0}\n",
    "broken.py": "raise RuntimeError('no licence key\\nsecond line')\n",
}


def test_each_kind_of_broken_plugin_is_its_own_line_with_its_field(tmp_path: Path) -> None:
    package = tmp_path / "plugins" / "brokenpkg"
    package.mkdir(parents=True)
    for name, text in BROKEN.items():
        (package / name).write_text(text)
    tree = _quickstart()
    tree["pipeline"]["plugin_paths"].append(str(tmp_path / "plugins"))
    evaluators = tree["rollout"]["manager"]["evaluators"]
    good = evaluators.pop("arithmetic_tool")
    rewards = {
        "no_module": "nopkg_xyz.rewards:score",
        "no_attribute": "brokenpkg.rewards:scor",
        "wrong_signature": "brokenpkg.rewards:two",
        "raises": "brokenpkg.broken:score",
    }
    for name, reward in rewards.items():
        evaluators[name] = {**good, "reward": reward}
    status, lines, output = _explain(tree, tmp_path)
    assert status == 2, output
    assert "Traceback" not in output
    field = "rollout.manager.evaluators.{}.reward: "
    assert sorted(lines) == sorted(
        [
            field.format("no_module") + "'nopkg_xyz.rewards:score': module 'nopkg_xyz' not found "
            "(put its folder on PYTHONPATH or install it)",
            field.format("no_attribute") + "'brokenpkg.rewards:scor': 'brokenpkg.rewards' has no "
            "attribute 'scor'",
            next(line for line in lines if line.startswith(field.format("wrong_signature"))),
            field.format("raises") + "'brokenpkg.broken:score': importing 'brokenpkg.broken' raised "
            "RuntimeError: no licence key",
        ]
    ), output
    signature = next(line for line in lines if line.startswith(field.format("wrong_signature")))
    assert "'brokenpkg.rewards:two': wrong signature for a reward function" in signature


USER_PROJECT = {
    # A user's project whose folders carry the generic names STACX's own folders have.
    "trainer/__init__.py": "",
    "trainer/rewards.py": (
        "from schemas import MARK\n"
        "from infra import BONUS\n"
        "def score(answer, data):\n"
        "    return {'reward': float(answer == data.get('answer')) + BONUS, 'mark': float(MARK)}\n"
    ),
    "schemas/__init__.py": "MARK = 7\n",
    "infra/__init__.py": "BONUS = 0.0\n",
}


def test_a_users_own_trainer_schemas_and_infra_folders_run_as_a_plugin(tmp_path: Path) -> None:
    """Our code lives in `stacx.*`: a project with top-level `trainer/`, `schemas/`, `infra/` of its own,
    on `plugin_paths: ["."]`, validates, and its reward is the one a run calls."""
    project = tmp_path / "project"
    for name, text in USER_PROJECT.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    tree = _quickstart()
    tree["pipeline"]["plugin_paths"].append(".")
    tree["rollout"]["manager"]["evaluators"]["arithmetic_tool"]["reward"] = "trainer.rewards:score"
    (project / "run.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    done = subprocess.run(
        [sys.executable, "-m", "stacx.infra.cli", "run", "run.yaml", "--explain"],
        cwd=project, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    called = subprocess.run(
        [sys.executable, "-c", (
            "import sys; sys.path.insert(0, '.')\n"
            "import stacx.infra.cli, stacx.trainer, stacx.schemas\n"
            "from stacx.rollout.rewards import get_reward\n"
            "print(get_reward('trainer.rewards:score')('4', {'answer': '4'}))\n"
            "import trainer, schemas\n"
            "print(trainer.__file__, schemas.__file__, stacx.trainer.__file__)\n"
        )],
        cwd=project, capture_output=True, text=True, timeout=300,
    )
    assert called.returncode == 0, called.stderr
    result, files = called.stdout.splitlines()
    assert result == "{'reward': 1.0, 'mark': 7.0}"
    user_trainer, user_schemas, ours = files.split()
    assert user_trainer == str(project / "trainer" / "__init__.py")
    assert user_schemas == str(project / "schemas" / "__init__.py")
    assert Path(ours).resolve() == REPO / "trainer" / "__init__.py"
