"""Every `stacx` command that reads a config file answers a bad one with one line and exit 2:
a missing file, bad YAML, an unknown field, a wrong type. Never a traceback, nothing started."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from stacx.infra.cli import main

AIME = Path(__file__).resolve().parents[2] / "benchmark_samples" / "aime2024"
"""A clean suite copy: `stacx bench run` reaches its config check with no row skipped."""
# command line (FILE stands for the config path), a file with one unknown field, one with a wrong type
COMMANDS: dict[str, tuple[list[str], str, str]] = {
    "run": (
        ["run", "FILE"],
        # otherwise valid (every problem of the file is reported, so the group sizes must agree)
        "pipeline: {model: {tiny: {}}, tasks: {topic: stacx.tasks}, stpes: 3}\n"
        "rollout: {data: {samples_per_task: 8}}\n",
        "pipeline: {model: {tiny: {}}, tasks: {topic: stacx.tasks}, steps: many}\n"
        "rollout: {data: {samples_per_task: 8}}\n",
    ),
    "train": (
        ["train", "FILE"],
        "recipe: grpo\nmodels: {policy: {tiny: {}}}\nlearning_rate: 0.1\n",
        "recipe: grpo\nmodels: {policy: {tiny: {}}}\noptimizer: {lr: fast}\n",
    ),
    "rollout": (
        ["rollout", "FILE"],
        "data: {path: tasks.jsonl}\nmanger: {}\n",
        "data: {path: tasks.jsonl, samples_per_task: many}\n",
    ),
    "eval": (
        ["eval", "FILE"],
        "data: {path: tasks.jsonl}\nmanger: {}\n",
        "data: {path: tasks.jsonl}\nmanager: {max_concurrent_episodes: lots}\n",
    ),
    "bench": (
        ["bench", "run", "aime2024", "FILE", "--from", str(AIME)],
        "inference: {tokenizer: model}\nmanger: {}\n",
        "manager: {max_concurrent_episodes: lots}\n",
    ),
    "assemble": (
        ["assemble", "--config", "FILE"],
        "assembler: {grouping: {group_sise: 4}}\n",
        "assembler: {partitions: many}\n",
    ),
    "infra up": (
        ["infra", "up", "--config", "FILE"],
        "bootstrap_server: k:9092\n",
        "bootstrap_servers: [1, 2]\n",
    ),
    "infra status": (
        ["infra", "status", "--config", "FILE"],
        "bootstrap_server: k:9092\n",
        "bootstrap_servers: {host: k}\n",
    ),
    "infra smoke": (
        ["infra", "smoke", "--config", "FILE"],
        "bootstrap_server: k:9092\n",
        "bootstrap_servers: [k]\n",
    ),
}
CASES = ("missing file", "bad YAML", "unknown field", "wrong type")
EXPECTED = {
    "missing file": "does not exist",
    "bad YAML": "is not valid YAML: line 3, column 1",
    "unknown field": "unknown field; valid fields:",
    "wrong type": "expected",
}


class Started(AssertionError):
    """A command went past its config check and started something."""


@pytest.fixture(autouse=True)
def _nothing_starts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Whatever a command would start fails the test instead (and leaves the shared services be)."""
    from stacx.infra.commands import infra as infra_command
    from stacx.infra.services import smoke, stack

    def started(*args: object, **kwargs: object) -> None:
        raise Started("the command started something before rejecting its config")

    for target, name in (
        (stack, "up"),
        (stack, "status"),
        (smoke, "kafka_round_trip"),
        (infra_command.stack, "up"),
        (infra_command.stack, "status"),
        (infra_command.smoke, "kafka_round_trip"),
    ):
        monkeypatch.setattr(target, name, started)
    monkeypatch.setattr("stacx.infra.pipeline.orchestrator.Pipeline._prepare_run_dir", started)
    monkeypatch.setattr("stacx.trainer.StacxTrainer.launch", started)
    monkeypatch.setattr("stacx.trainer.ranks.spawn_trainer", started)  # `stacx train` on local ranks
    monkeypatch.setattr("stacx.rollout.service.run_rollout", started)
    monkeypatch.setattr("stacx.consumers.assembly.AssemblerApp.run", started)
    previous = signal.getsignal(signal.SIGTERM)  # `stacx` installs its own handler
    yield
    signal.signal(signal.SIGTERM, previous)


def _write(tmp_path: Path, command: str, case: str) -> Path:
    _, unknown, wrong = COMMANDS[command]
    path = tmp_path / "config.yaml"
    text = {
        "missing file": None,
        "bad YAML": "a: 1\nb: [1, 2\n",
        "unknown field": unknown,
        "wrong type": wrong,
    }[case]
    if text is not None:
        path.write_text(text)
    return path


def _stacx(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    return int(exit_info.value.code or 0), [line for line in captured.err.splitlines() if line.strip()]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_bad_config_is_one_line_and_exit_2(
    command: str, case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, command, case)
    argv = [str(path) if arg == "FILE" else arg for arg in COMMANDS[command][0]]
    code, lines = _stacx(argv, capsys)
    assert code == 2, lines
    assert len(lines) == 1, lines
    (line,) = lines
    assert line.startswith(f"stacx {command.split()[0]}: ") and str(path) in line, line
    assert EXPECTED[case] in line, line
    assert "Traceback" not in line


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "is empty; `stacx init` writes a commented starter config"),
        ("- a\n- b\n", "must be a mapping of sections, got list"),
    ],
)
def test_run_rejects_an_empty_or_non_mapping_file(
    text: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    code, lines = _stacx(["run", str(path)], capsys)
    assert code == 2 and len(lines) == 1 and expected in lines[0], lines


def test_run_on_a_directory_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = _stacx(["run", str(tmp_path)], capsys)
    assert (code, lines) == (2, [f"stacx run: {tmp_path} is a directory; pass a YAML config file"])


def test_run_reports_every_problem_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "pipeline: {name: x, runs_dir: " + str(tmp_path / "runs") + ", model: {path: nowhere},"
        " tasks: {harbor: nothing}}\n"
        "rollout: {data: {samples_per_task: 2}, manager: {evaluators: {default: {scaffold: terminal,"
        " reward: verifier}}}}\n"
        "trainer: {recipe: nope}\n"
    )
    code, lines = _stacx(["run", str(path)], capsys)
    assert code == 2
    assert [line.split(": ")[2].split("=")[0] for line in lines] == [
        "trainer.recipe",
        "pipeline.model.path",
        "pipeline.tasks.harbor",
    ], lines
    assert not (tmp_path / "runs").exists()  # nothing was created


def test_train_names_a_missing_model_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "trainer.yaml"
    path.write_text(f"models: {{policy: {{path: {tmp_path / 'none'}}}}}\n")
    code, lines = _stacx(["train", str(path)], capsys)
    assert code == 2
    assert lines == [
        f"stacx train: {path}: models.policy.path={tmp_path / 'none'}: no such directory "
        "(`stacx models tiny --out DIR` makes a small model)"
    ]


def test_rollout_names_a_bad_scaffold_and_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tasks.jsonl").write_text('{"task_id": "a", "task_type": "t", "prompt": "p"}\n')
    path = tmp_path / "rollout.yaml"
    path.write_text(
        "data: {path: tasks.jsonl}\n"
        f"inference: {{tokenizer: {tmp_path / 'none'}}}\n"
        "manager: {evaluators: {default: {scaffold: termnal}}}\n"
    )
    code, lines = _stacx(["rollout", str(path)], capsys)
    assert code == 2
    assert lines == [
        f"stacx rollout: {path}: manager.evaluators.default.scaffold: 'termnal' is not a known "
        "scaffold; use one of ['retool', 'single_turn', 'terminal'] or a dotted path "
        "package.module:object (`stacx plugins` lists them); did you mean 'terminal'?",
        f"stacx rollout: {path}: inference.tokenizer={tmp_path / 'none'}: no such directory; "
        "point it at the model directory",
    ]


def test_init_writes_a_starter_that_parses_and_never_overwrites(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stacx.infra.pipeline import load_spec

    path = tmp_path / "my.yaml"
    code, _ = _stacx(["init", str(path)], capsys)
    assert code == 0 and path.read_text().startswith("# A STACX pipeline")
    spec = load_spec(path)
    assert spec.pipeline.tasks.harbor == "tasks" and spec.pipeline.model.path == "models/my-model"
    path.write_text("mine\n")
    code, lines = _stacx(["init", str(path)], capsys)
    assert (code, lines) == (2, [f"stacx init: {path} exists; pass --force to overwrite it"])
    assert path.read_text() == "mine\n"


def test_assemble_refuses_a_dead_letter_topic_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[list[str]] = []

    def missing(bootstrap: str, names: list[str], *, timeout_s: float = 10.0) -> list[str]:
        asked.append(names)
        return [n for n in names if n != "stacx.dlq"]

    monkeypatch.setattr("stacx.infra.services.topics.missing_topics", missing)
    monkeypatch.setattr("stacx.infra.services.reachability.kafka_problem", lambda *a, **k: None)  # it answers
    path = tmp_path / "asm.yaml"
    path.write_text("bootstrap_servers: k:9092\nassembler: {dlq_topic: stacx.dql}\n")
    code, lines = _stacx(["assemble", "--config", str(path)], capsys)
    assert asked == [["stacx.dql"]]
    assert (code, lines) == (
        2,
        [
            "stacx assemble: assembler.dlq_topic='stacx.dql': no such topic on k:9092; check the name, "
            "or create it (`stacx infra up` creates stacx.dlq)"
        ],
    )


def test_run_preflight_names_a_missing_dead_letter_or_tasks_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    from stacx.infra.pipeline import MissingComponentError, parse_spec, preflight

    monkeypatch.setattr(preflight, "_kafka_problem", lambda bootstrap: None)
    monkeypatch.setattr(preflight, "_ports_problems", lambda spec: [])
    monkeypatch.setattr("stacx.infra.services.topics.missing_topics", lambda b, names, **kw: names)
    spec = parse_spec(
        {
            "bootstrap_servers": "k:9092",
            "pipeline": {
                "model": {"tiny": {}},
                "tasks": {"topic": "my.tasks"},
            },
            "gateway": {"backend": "process"},
            "rollout": {"data": {"samples_per_task": 8}},
            "assembler": {"dlq_topic": "stacx.dql"},
        }
    )
    with pytest.raises(MissingComponentError) as info:
        preflight.check_all(spec)
    assert info.value.missing == [
        "the topic my.tasks (pipeline.tasks.topic) on k:9092: check the name, or create it "
        "(`stacx infra up` creates the standard topics)",
        "the topic stacx.dql (assembler.dlq_topic) on k:9092: check the name, or create it "
        "(`stacx infra up` creates the standard topics)",
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["proxy", "--port", "70000", "--upstream", "http://127.0.0.1:9"],
        ["gateway", "--port", "70000", "--backend", "process"],
        ["serve", "--port", "70000", "--model", "/nonexistent"],
    ],
    ids=["proxy", "gateway", "serve"],
)
def test_a_port_out_of_range_is_one_line_before_anything_starts(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The gateway died on it with a bind() traceback, the proxy waited a minute for its upstream."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and len(lines) == 1 and "70000" in lines[0], lines
