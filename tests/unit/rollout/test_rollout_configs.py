"""Every shipped rollout config loads and builds a manager (all errors reported at once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacx.rollout.config import RolloutConfig, load_config
from stacx.rollout.data import ListTaskSource, load_tasks_jsonl
from stacx.rollout.errors import ConfigError
from stacx.rollout.fakes import (
    FakeCapture,
    FakeEnvironments,
    FakeTokenizer,
    MemoryPublisher,
    ScriptedInference,
)
from stacx.rollout.manager import RolloutManager
from stacx.schemas.config import ConfigError as LoaderError
from stacx.schemas.config import build
from stacx.schemas.records import TaskSample

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "rollout"


def _manager_with_fakes(config: RolloutManager.Config) -> RolloutManager:
    tok = FakeTokenizer()
    return RolloutManager(
        config,
        source=ListTaskSource([TaskSample(task_id="t", task_type="x", prompt="p")]),
        tokenizer=tok,
        inference=ScriptedInference(tok, lambda c, i: ""),
        publisher=MemoryPublisher(),
        sandbox=FakeEnvironments(),
        capture=FakeCapture(),  # type: ignore[arg-type]
    )


def _build(path: Path) -> None:
    config = load_config(path)
    _manager_with_fakes(config.manager)
    if config.data.path:
        assert load_tasks_jsonl(config.data.path)
    if config.data.task_dirs:
        assert Path(config.data.task_dirs).is_dir(), config.data.task_dirs


def test_every_shipped_config_builds() -> None:
    paths = sorted(EXAMPLES.glob("*.yaml"))
    assert len(paths) >= 3
    errors = []
    for path in paths:
        try:
            _build(path)
        except Exception as exc:
            errors.append(f"{path.name}: {type(exc).__name__}: {exc}")
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"data": {"path": "a", "topic": "b"}}, "exactly one of path, task_dirs, topic"),
        ({"data": {"path": "a"}, "manager": {"pool": {"tpus": 1}}}, "unknown resource kind"),
        (
            {"data": {"path": "a"}, "manager": {"evaluators": {"x": {"scafold": "retool"}}}},
            "config: manager.evaluators.x.scafold: unknown field; valid fields: ",
        ),
        (
            {"data": {"path": "a"}, "manager": {"evaluators": {"x": {"max_turns": 0}}}},
            "config: manager.evaluators.x.max_turns: expected greater than 0, got 0",
        ),
        ({"data": {"path": "a"}, "inference": {"wait_ready_s": -1}},
         "config: inference.wait_ready_s: expected greater than or equal to 0, got -1"),
    ],
)
def test_bad_configs_name_the_field(values: dict, fragment: str) -> None:
    with pytest.raises(LoaderError) as info:  # the loader's, or the manager's own (a subclass)
        _manager_with_fakes(build(RolloutConfig, values, where="config").manager)
    assert fragment in str(info.value)


def test_tasks_jsonl_errors_name_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"task_id": "a", "task_type": "m", "prompt": "p"}\n{"task_id": "b"}\n')
    with pytest.raises(ConfigError, match=r"tasks.jsonl:2: missing required field"):
        load_tasks_jsonl(path)


async def test_sandbox_takes_a_list_of_gateways() -> None:
    from stacx.rollout.service import build_environments

    config = build(
        RolloutConfig,
        {
            "data": {"path": "tasks.jsonl"},
            "sandbox": {"urls": ["http://10.0.0.1:8700", "http://10.0.0.2:8700"], "idle_timeout_s": 120},
        },
        where="config",
    )
    assert config.sandbox is not None
    closers: list[object] = []
    environments = build_environments(config, closers)
    assert list(environments.load()) == ["http://10.0.0.1:8700", "http://10.0.0.2:8700"]
    assert environments.config.idle_timeout_s == 120
    for closer in closers:
        await closer.aclose()  # type: ignore[attr-defined]
    assert build(RolloutConfig, {"data": {"path": "t"}}, where="config").sandbox.gateway_urls() == ["http://127.0.0.1:8700"]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("sandbox", "message"),
    [
        ({"url": "http://a:1", "urls": ["http://b:1"]}, "not both"),
        ({"urls": ["a:1"]}, "must start with http"),
        ({"urls": ["http://a:1", "http://a:1"]}, "twice"),
    ],
)
def test_bad_gateway_lists_are_refused(sandbox: dict[str, object], message: str) -> None:
    with pytest.raises(LoaderError, match=message):
        build(RolloutConfig, {"data": {"path": "t"}, "sandbox": sandbox}, where="config")
