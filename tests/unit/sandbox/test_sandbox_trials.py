"""Harbor trials over an in-memory backend: step order, merged tests, step env, workdir uploads,
min_reward early stop, reward totals; the image map and Dockerfile rewrite; network hints."""

from __future__ import annotations

from pathlib import Path

import pytest
from harbor_cookbook import cookbook

from stacx.sandbox.backends.fake import FakeBackend, FakeSandbox
from stacx.sandbox.checks import network_hint
from stacx.sandbox.errors import HealthcheckFailed
from stacx.sandbox.images import (
    DEFAULT_BASE_IMAGES,
    STAND_IN_DEBIAN,
    STAND_IN_PYTHON,
    map_base_image,
    rewrite_from,
)
from stacx.sandbox.models import ExecRequest, ExecResult, SessionSpec, VerifyResult
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.task_config import Healthcheck
from stacx.sandbox.tasks import load_task
from stacx.sandbox.trials import StepOutcome, run_healthcheck, run_trial, total_rewards


class _Script:
    """Fake sandbox behaviour: each test.sh run writes the next reward; records what it saw."""

    def __init__(self, rewards: list[str], *, healthy: bool = True) -> None:
        self.rewards = list(rewards)
        self.healthy = healthy
        self.seen: list[tuple[str, dict[str, str], list[str]]] = []

    def __call__(self, sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
        code = 0
        if request.command.endswith("bash /tests/test.sh"):
            tests = sorted(p for p in sandbox.files if p.startswith("/tests/"))
            self.seen.append(("verify", dict(request.env), tests))
            sandbox.files["/logs/verifier/reward.txt"] = self.rewards.pop(0).encode()
        elif request.command.startswith("test -x"):
            code = 0 if self.healthy else 1
        elif request.command.startswith("rm -rf /tests/*"):
            for path in [p for p in sandbox.files if p.startswith(("/tests/", "/logs/verifier/"))]:
                del sandbox.files[path]
        return ExecResult(exit_code=code, stdout="", stderr="", duration_s=0.01)


async def _run(script: _Script, agent_steps: list[str] | None = None):  # type: ignore[no-untyped-def]
    task = load_task(cookbook() / "multi-step")
    backend = FakeBackend(script)
    async with SessionManager(SessionManager.Config(owner="t"), backend) as manager:
        session = await manager.create(SessionSpec(workdir="/app"))
        seen: list[str] = [] if agent_steps is None else agent_steps

        async def agent(step):  # type: ignore[no-untyped-def]
            seen.append(step.name)

        outcome = await run_trial(manager, session.id, task, agent, workdir="/app")
        return outcome, backend.sandboxes[f"fake-{session.id}"]


async def test_steps_run_in_order_with_merged_tests_and_step_env() -> None:
    script = _Script(["1", "1", "1"])
    order: list[str] = []
    outcome, sandbox = await _run(script, order)
    assert order == ["scaffold", "implement", "document"]
    assert [s.name for s in outcome.steps] == order and outcome.reward == 1.0
    for _, _, tests in script.seen:
        assert "/tests/helpers.sh" in tests and "/tests/test.sh" in tests  # top-level + step tests
    assert "/tests/expected.txt" in script.seen[1][2] and "/tests/expected.txt" not in script.seen[2][2]
    assert script.seen[1][1]["EXPECTED_NAME"] == "Harbor" and "EXPECTED_NAME" not in script.seen[0][1]
    assert sandbox.files["/app/config.txt"] == b"Harbor\n"  # implement's workdir/ uploaded
    assert "bash /app/setup.sh" in sandbox.commands and "test -x /app/greet.sh" in sandbox.commands


async def test_min_reward_stops_the_remaining_steps() -> None:
    outcome, _ = await _run(_Script(["1", "0.25", "1"]))
    assert [s.name for s in outcome.steps] == ["scaffold", "implement"]
    assert outcome.stopped_after == "implement" and outcome.reward == pytest.approx(0.625)
    first, _ = await _run(_Script(["0"]))
    assert [s.name for s in first.steps] == ["scaffold"] and first.reward == 0.0


async def test_failed_step_healthcheck_is_an_error() -> None:
    with pytest.raises(
        HealthcheckFailed, match="step implement healthcheck `test -x /app/greet.sh` failed 3 times"
    ):
        await _run(_Script(["1", "1", "1"], healthy=False))


def _outcome(name: str, rewards: dict[str, float]) -> StepOutcome:
    result = VerifyResult(reward=0.0, rewards=rewards, exit_code=0, stdout="", stderr="", duration_s=0.0)
    return StepOutcome(name=name, result=result)


def test_total_rewards_mean_and_final() -> None:
    task = load_task(cookbook() / "multi-step")
    steps = [_outcome("a", {"reward": 1.0, "style": 1.0}), _outcome("b", {"reward": 0.0})]
    assert total_rewards(task, steps) == {"reward": 0.5, "style": 0.5}
    task.multi_step_reward_strategy = "final"
    assert total_rewards(task, steps) == {"reward": 0.0}
    assert total_rewards(task, []) == {"reward": 0.0}


async def test_healthcheck_passes_at_first_success() -> None:
    calls: list[str] = []

    def handler(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
        calls.append(request.command)
        return ExecResult(exit_code=0 if len(calls) >= 2 else 1, stdout="", stderr="", duration_s=0.0)

    backend = FakeBackend(handler)
    async with SessionManager(SessionManager.Config(owner="t"), backend) as manager:
        session = await manager.create(SessionSpec())
        check = Healthcheck(command="probe", interval_s=0.01, retries=3)
        await run_healthcheck(manager, session.id, check, where="task x")
    assert calls == ["probe", "probe"]


@pytest.mark.parametrize(
    ("image", "local"),
    [
        ("ubuntu:24.04", STAND_IN_DEBIAN),
        ("docker.io/library/ubuntu:22.04", STAND_IN_DEBIAN),
        ("ubuntu", STAND_IN_DEBIAN),
        ("debian:bookworm-slim", STAND_IN_DEBIAN),
        ("python:3.12-slim", STAND_IN_PYTHON),
        ("ghcr.io/astral-sh/uv:latest", None),
        ("node:20", None),
    ],
)
def test_base_image_map(image: str, local: str | None) -> None:
    assert map_base_image(image, DEFAULT_BASE_IMAGES) == local


def test_explicit_entries_win_over_patterns() -> None:
    mapping = {"ubuntu:24.04": "mine/ubuntu:24.04", **DEFAULT_BASE_IMAGES}
    assert map_base_image("ubuntu:24.04", mapping) == "mine/ubuntu:24.04"
    assert map_base_image("ubuntu:20.04", mapping) == STAND_IN_DEBIAN


def test_rewrite_from_keeps_flags_and_stages() -> None:
    text = "FROM --platform=linux/amd64 ubuntu:24.04 AS base\nRUN echo FROM ubuntu:24.04\nfrom base\n"
    out = rewrite_from(text, {"ubuntu:24.04": "stand/in:1"})
    assert out == "FROM --platform=linux/amd64 stand/in:1 AS base\nRUN echo FROM ubuntu:24.04\nfrom base\n"


@pytest.mark.parametrize(
    "line",
    [
        "curl: (6) Could not resolve host: astral.sh",
        "Err:1 http://deb.debian.org/debian bookworm InRelease  Temporary failure resolving 'deb.debian.org'",
        "  × No solution found when resolving tool dependencies:",
        "error: Failed to fetch: `https://pypi.org/simple/requests/`",
    ],
)
def test_network_hint_finds_the_line(line: str) -> None:
    assert network_hint(f"some output\n{line}\nmore") == line.strip()[:200]


def test_network_hint_stays_quiet_on_plain_failures() -> None:
    assert network_hint("AssertionError: expected 2, got 3\nFAILED tests/test_x.py") is None


def test_examples_dir_fixture_path_is_repo_relative() -> None:
    assert cookbook().name == "harbor-cookbook" and Path(cookbook(), "..").resolve().name == "shared"
