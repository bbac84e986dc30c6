"""Sandbox sessions: lifetime from the episode budget, renewal on a fake clock, many gateways."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import socket
import threading
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

import stacx.sandbox.backends.fake as fake_backend_module
import stacx.sandbox.sessions as sessions_module
from stacx.rollout.config import SandboxConfig
from stacx.rollout.errors import ConfigError, EnvironmentStepError
from stacx.rollout.evaluator import Evaluator
from stacx.rollout.fakes import FakeEnvironments, FakeTokenizer, ScriptedInference
from stacx.rollout.gateways import GatewayEnvironments
from stacx.rollout.protocols import Generation, SamplingParams, TaskGroup
from stacx.rollout.resources import LocalPool, ResourcePool, Resources
from stacx.sandbox.client import SandboxClient
from stacx.sandbox.errors import BackendError, CapacityExceeded, EngineWedged, InvalidSpec
from stacx.sandbox.gateway import create_app
from stacx.sandbox.models import ExecResult
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.testing import FakeBackend
from stacx.schemas.records import TaskSample, TrajectoryStatus

HOUR = 3600.0


class FakeClock:
    """Wall time that moves only when the test says so; `sleep` waits for it."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._ids = itertools.count()

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + seconds, next(self._ids), future))
        await future

    async def advance(self, seconds: float) -> None:
        self.now += seconds
        while self._sleepers and self._sleepers[0][0] <= self.now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)
        for _ in range(30):  # let the woken coroutines (and in-process HTTP) run
            await asyncio.sleep(0)


def _in_process_gateway(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> tuple[SessionManager, SandboxClient]:
    fake_time = types.SimpleNamespace(time=clock.time, monotonic=clock.time)
    monkeypatch.setattr(sessions_module, "time", fake_time)
    monkeypatch.setattr(fake_backend_module, "time", fake_time)  # its reaper checks expiry too
    backend = FakeBackend(
        lambda sandbox, request: ExecResult(exit_code=0, stdout="42\n", stderr="", duration_s=0)
    )
    manager = SessionManager(SessionManager.Config(), backend)  # gateway defaults: idle 30 min, max 12 h
    app = create_app(manager, token=None, manage_lifecycle=False)
    client = SandboxClient(
        SandboxClient.Config(base_url="http://gateway", transport=httpx.ASGITransport(app))
    )
    return manager, client


class _SlowFirstTurn:
    """The model thinks for `think_s` (fake clock) before its first turn: a quiet sandbox."""

    def __init__(self, clock: FakeClock, think_s: float) -> None:
        tok = FakeTokenizer()
        self.tokenizer = tok
        self.clock, self.think_s = clock, think_s
        script = ("<tool_call>print(6*7)</tool_call>", "<answer>42</answer>")
        self.inner = ScriptedInference(
            tok, lambda ctx, call: script[1] if "<tool_response>\n" in ctx else script[0]
        )

    async def generate(self, input_ids: Any, params: SamplingParams) -> Generation:
        if not self.inner.calls:
            await self.clock.sleep(self.think_s)
        return await self.inner.generate(input_ids, params)


async def test_a_five_hour_episode_keeps_its_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model thinks 5 h before its first tool call. The old engine asked for a 3,600 s
    sandbox and never renewed it: the gateway closed it (idle after 30 min, expired after 1 h)
    and the episode ended FAILED."""
    clock = FakeClock()
    manager, client = _in_process_gateway(clock, monkeypatch)
    envs = GatewayEnvironments(client, GatewayEnvironments.Config(idle_timeout_s=300), sleep=clock.sleep)
    inference = _SlowFirstTurn(clock, think_s=5 * HOUR)
    config = Evaluator.Config(scaffold="retool", episode_timeout_s=8 * HOUR)
    budget = Resources(sandboxes=1, cpu=2, memory_mb=2048, generations=1)
    evaluator = Evaluator(
        config,
        name="long",
        tokenizer=inference.tokenizer,
        inference=inference,
        environments=envs,
        global_pool=ResourcePool(budget),
    )
    task = TaskSample(task_id="t", task_type="long", prompt="6*7?", data='{"answer": 42}')
    async with LocalPool.drawn(evaluator.global_pool, evaluator.demand.local_pool, name="ep") as local:
        run = asyncio.create_task(evaluator.run(TaskGroup(group_id="g", task=task, num_samples=1), 0, local))
        await clock.advance(0)
        (info,) = manager.list()
        assert info.expires_at - info.created_at == pytest.approx(8 * HOUR + 120)
        assert info.idle_timeout_s == 300
        while not run.done():
            await clock.advance(60)
            await manager.reap_once()  # the gateway's reaper: expiry and idle timeout
        trajectory = run.result()
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.reward == 1.0 and [t.role for t in trajectory.turns].count("tool") == 1
    assert manager.list() == []  # closed at the end of the episode
    assert manager.stats["sessions_expired_total"] == 0


async def test_renewal_stops_when_the_session_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    manager, client = _in_process_gateway(clock, monkeypatch)
    envs = GatewayEnvironments(client, GatewayEnvironments.Config(idle_timeout_s=300), sleep=clock.sleep)
    task = TaskSample(task_id="t", task_type="m", prompt="p")
    session = await envs.open(task, cpus=1, memory_mb=256, lifetime_s=2 * HOUR)
    for _ in range(360):  # an hour of quiet: renewed every 100 s, never idle-closed
        await clock.advance(10)
        await manager.reap_once()
    (info,) = manager.list()
    assert session.num_renewals in (35, 36) and clock.now - info.last_used_at <= 100
    await session.close()
    renewals = session.num_renewals
    await clock.advance(3600)
    assert session.num_renewals == renewals and manager.list() == []


async def test_without_renewal_the_gateway_closes_a_quiet_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: what the renewal prevents (idle timeout 300 s, nobody touching)."""
    clock = FakeClock()
    manager, client = _in_process_gateway(clock, monkeypatch)
    info = await client.create_session(image="stacx/sandbox:bookworm", idle_timeout_s=300, lifetime_s=HOUR)
    await clock.advance(301)
    await manager.reap_once()
    assert manager.list() == [] and manager.stats["sessions_expired_total"] == 1
    assert info.id


async def test_evaluator_asks_for_a_sandbox_as_long_as_its_budget() -> None:
    tok = FakeTokenizer()
    script = ("<tool_call>print(1)</tool_call>", "<answer>42</answer>")
    inference = ScriptedInference(tok, lambda ctx, call: script[min(call, 1)])
    envs = FakeEnvironments()
    for budget, expected in ((600.0, 720.0), (10 * HOUR, 10 * HOUR + 120), (12 * HOUR, 12 * HOUR)):
        evaluator = Evaluator(
            Evaluator.Config(episode_timeout_s=budget),
            name="m",
            tokenizer=tok,
            inference=inference,
            environments=envs,
            global_pool=ResourcePool(Resources(sandboxes=1, cpu=2, memory_mb=2048, generations=1)),
        )
        task = TaskSample(task_id="t", task_type="m", prompt="p", data='{"answer": 42}')
        async with LocalPool.drawn(evaluator.global_pool, evaluator.demand.local_pool, name="e") as local:
            await evaluator.run(TaskGroup(group_id="g", task=task, num_samples=1), 0, local)
        assert envs.lifetimes[-1] == expected


def test_episode_budget_above_twelve_hours_is_refused() -> None:
    with pytest.raises(ValueError, match=r"episode_timeout_s = 50000.*<= 43200"):
        Evaluator.Config(episode_timeout_s=50_000)


# -- many gateways -------------------------------------------------------------------------------


@dataclass
class _Info:
    id: str
    created_at: float = 0.0
    expires_at: float = 3600.0
    idle_timeout_s: float = 300.0


@dataclass
class _Health:
    backend: str = "docker"
    problem: str | None = None


@dataclass
class FakeGateway:
    """A gateway client that can be killed, degraded or revived."""

    name: str
    backend: str = "docker"
    dead: bool = False
    problem: str | None = None
    sessions: set[str] = field(default_factory=set)
    created: list[dict[str, Any]] = field(default_factory=list)
    _ids: Any = field(default_factory=itertools.count)

    @property
    def config(self) -> Any:
        return types.SimpleNamespace(base_url=f"http://{self.name}")

    def _check(self) -> None:
        if self.dead:
            raise BackendError(f"cannot reach the gateway at http://{self.name} (ConnectError)")

    async def health(self) -> _Health:
        self._check()
        return _Health(backend=self.backend, problem=self.problem)

    async def create_session(self, **spec: Any) -> _Info:
        self._check()
        if spec.get("task_dir") and self.backend != "docker":
            raise InvalidSpec("task_dir sessions need task images")
        session_id = f"{self.name}-{next(self._ids)}"
        self.sessions.add(session_id)
        self.created.append(spec)
        return _Info(id=session_id, expires_at=spec["lifetime_s"], idle_timeout_s=spec["idle_timeout_s"])

    async def exec(self, session_id: str, command: str, **_: Any) -> Any:
        self._check()
        return types.SimpleNamespace(
            exit_code=0, stdout="ok", stderr="", truncated=False, timed_out=False, duration_s=0.0
        )

    async def touch_session(self, session_id: str) -> None:
        self._check()

    async def close_session(self, session_id: str) -> None:
        self._check()
        self.sessions.discard(session_id)


def _task(task_dir: str | None = None) -> TaskSample:
    return TaskSample(task_id="t", task_type="m", prompt="p", task_dir=task_dir)


def _envs(*gateways: FakeGateway, clock: FakeClock | None = None, **options: Any) -> GatewayEnvironments:
    clock = clock or FakeClock()
    return GatewayEnvironments(
        list(gateways), GatewayEnvironments.Config(**options), sleep=clock.sleep, clock=clock.time
    )


async def test_sessions_go_to_the_least_loaded_gateway() -> None:
    a, b = FakeGateway("a"), FakeGateway("b")
    envs = _envs(a, b)
    sessions = [await envs.open(_task(), cpus=1, memory_mb=256) for _ in range(4)]
    assert len(a.sessions) == 2 and len(b.sessions) == 2
    first_on_a = next(s for s in sessions if s.session_id.startswith("a"))
    await first_on_a.close()
    await envs.open(_task(), cpus=1, memory_mb=256)
    assert len(a.sessions) == 2 and envs.load()["http://a"]["active"] == 2
    assert envs.load()["http://b"] == {
        "active": 2,
        "creating": 0,
        "opened": 2,
        "failures": 0,
        "up": True,
        "backend": "docker",
        "problem": None,
    }


async def test_a_dying_gateway_fails_its_episodes_and_new_ones_go_elsewhere() -> None:
    clock = FakeClock()
    a, b = FakeGateway("a"), FakeGateway("b")
    envs = _envs(a, b, clock=clock, down_for_s=30)
    on_a = await envs.open(_task(), cpus=1, memory_mb=256)
    await envs.open(_task(), cpus=1, memory_mb=256)
    assert on_a.session_id.startswith("a")
    a.dead = True
    with pytest.raises(EnvironmentStepError, match="cannot reach the gateway at http://a"):
        await on_a.exec("true")
    assert envs.load()["http://a"]["up"] is False
    placed = [await envs.open(_task(), cpus=1, memory_mb=256) for _ in range(3)]
    assert all(s.session_id.startswith("b") for s in placed)
    # it comes back: after down_for_s it is probed, and used again (it is the least loaded)
    a.dead = False
    await clock.advance(31)
    revived = await envs.open(_task(), cpus=1, memory_mb=256)
    assert revived.session_id.startswith("a") and envs.load()["http://a"]["up"] is True


async def test_create_fails_over_to_the_next_gateway() -> None:
    a, b = FakeGateway("a"), FakeGateway("b")
    envs = _envs(a, b)
    await envs.open(_task(), cpus=1, memory_mb=256)  # both probed and up
    a.dead = True  # dies between probe and create: the create itself fails over
    session = await envs.open(_task(), cpus=1, memory_mb=256)
    session2 = await envs.open(_task(), cpus=1, memory_mb=256)
    assert session.session_id.startswith("b") and session2.session_id.startswith("b")
    assert envs.load()["http://a"]["failures"] >= 1


async def test_degraded_gateway_is_skipped_and_all_down_is_an_episode_error() -> None:
    a = FakeGateway("a", problem="docker engine wedged: restart dockerd")
    b = FakeGateway("b", dead=True)
    envs = _envs(a, b)
    with pytest.raises(EnvironmentStepError, match="no gateway could take it.*wedged"):
        await envs.open(_task(), cpus=1, memory_mb=256)


async def test_wedged_engine_on_create_marks_the_gateway_down() -> None:
    class Wedged(FakeGateway):
        async def create_session(self, **spec: Any) -> _Info:
            raise EngineWedged("docker engine wedged")

    a, b = Wedged("a"), FakeGateway("b")
    envs = _envs(a, b)
    session = await envs.open(_task(), cpus=1, memory_mb=256)
    assert session.session_id.startswith("b") and envs.load()["http://a"]["up"] is False


async def test_task_directories_go_only_to_gateways_that_build_task_images() -> None:
    a, b = FakeGateway("a", backend="process"), FakeGateway("b")
    envs = _envs(a, b)
    for _ in range(3):
        await envs.open(_task(task_dir="/tasks/x"), cpus=1, memory_mb=256)
    assert len(b.sessions) == 3 and not a.sessions
    await envs.open(_task(), cpus=1, memory_mb=256)
    assert len(a.sessions) == 1  # plain images go anywhere (a is the least loaded)


async def test_per_gateway_session_limit() -> None:
    a, b = FakeGateway("a"), FakeGateway("b")
    envs = _envs(a, b, max_sessions_per_gateway=1)
    await envs.open(_task(), cpus=1, memory_mb=256)
    await envs.open(_task(), cpus=1, memory_mb=256)
    with pytest.raises(EnvironmentStepError, match="no gateway could take it"):
        await envs.open(_task(), cpus=1, memory_mb=256)


async def test_bad_request_is_not_blamed_on_the_gateway() -> None:
    a = FakeGateway("a", backend="process")
    envs = _envs(a)
    a.backend = "docker"  # it claims docker at the probe, then refuses the task
    envs.gateways[0].backend = "docker"
    a.backend = "process"
    with pytest.raises(EnvironmentStepError, match="InvalidSpec"):
        await envs.open(_task(task_dir="/tasks/x"), cpus=1, memory_mb=256)
    assert envs.load()["http://a"]["up"] is True


@dataclass
class _FullGateway(FakeGateway):
    """Answers 'full' (CapacityExceeded, as a gateway at its session budget does) `full_for` times."""

    full_for: int = 0

    async def create_session(self, **spec: Any) -> _Info:
        if self.full_for > 0:
            self.full_for -= 1
            raise CapacityExceeded("live sessions would hold memory_mb=24320, above the gateway's budget")
        return await super().create_session(**spec)


async def test_a_full_gateway_is_back_pressure_not_a_failed_episode() -> None:
    clock = FakeClock()
    gateway = _FullGateway("a", full_for=3)
    envs = _envs(gateway, clock=clock)
    opening = asyncio.ensure_future(envs.open(_task(), cpus=1, memory_mb=256))
    for _ in range(50):
        await clock.advance(1.0)
        if opening.done():
            break
    session = await opening
    assert session.session_id.startswith("a-") and gateway.full_for == 0


async def test_a_gateway_full_past_the_wait_fails_the_episode_with_the_reason() -> None:
    clock = FakeClock()
    envs = _envs(_FullGateway("a", full_for=1000), clock=clock, full_wait_s=10.0)
    opening = asyncio.ensure_future(envs.open(_task(), cpus=1, memory_mb=256))
    for _ in range(50):
        await clock.advance(1.0)
        if opening.done():
            break
    with pytest.raises(EnvironmentStepError, match="no gateway could take it .*full"):
        await opening


class _HungGateway(FakeGateway):
    """Accepts connections and never answers: its engine or event loop is wedged."""

    async def health(self) -> _Health:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def create_session(self, **spec: Any) -> _Info:
        self.created.append(spec)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def _open_within(envs: GatewayEnvironments, seconds: float) -> Any:
    """An episode's session, or a failure (not a hang) when it waits on a hung gateway."""
    try:
        return await asyncio.wait_for(envs.open(_task(), cpus=1, memory_mb=256), seconds)
    except TimeoutError:
        pytest.fail(f"the session was not opened within {seconds} s: it went to the hung gateway")


async def test_a_hung_gateway_counts_its_waiting_requests_and_is_routed_around() -> None:
    clock = FakeClock()
    hung, b = FakeGateway("a"), FakeGateway("b")
    envs = _envs(hung, b, clock=clock, unresponsive_after_s=10, health_timeout_s=0.05)
    await envs.open(_task(), cpus=1, memory_mb=256)  # both probed and up; this one on a
    await envs.open(_task(), cpus=1, memory_mb=256)  # on b
    hung.__class__ = _HungGateway  # a wedges now
    waiting = [asyncio.ensure_future(envs.open(_task(), cpus=1, memory_mb=256))]
    await clock.advance(0)
    assert len(hung.created) == 2 and envs.load()["http://a"]["creating"] == 1
    # its waiting request counts as load: the next episode goes to b, not to the hung gateway
    assert (await _open_within(envs, 5)).session_id.startswith("b")
    assert len(hung.created) == 2
    # once its request has waited unresponsive_after_s, /healthz is asked; no answer: down
    await clock.advance(11)
    for _ in range(4):
        assert (await _open_within(envs, 5)).session_id.startswith("b")
    load = envs.load()["http://a"]
    assert load["up"] is False and "/healthz did not answer within 0.05 s" in load["problem"]
    assert len(hung.created) == 2
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert envs.load()["http://a"]["creating"] == 0


def test_the_gateway_request_timeout_is_set_in_the_sandbox_section() -> None:
    from stacx.infra.config import build
    from stacx.rollout.config import RolloutConfig
    from stacx.rollout.service import build_environments

    config = build(
        RolloutConfig,
        {"data": {"path": "tasks.jsonl"}, "sandbox": {"request_timeout_s": 7.5, "unresponsive_after_s": 3}},
        where="rollout.yaml",
    )
    closers: list[Any] = []
    envs = build_environments(config, closers)
    assert envs.config.unresponsive_after_s == 3
    assert envs.client.config.timeout_s == 7.5


@contextlib.contextmanager
def _real_gateway(port: int = 0) -> Iterator[tuple[str, int]]:
    """A real gateway (HTTP on 127.0.0.1, fake sandboxes) on `port` (0: a free one), served by
    uvicorn in a thread; yields (url, port). Leaving the block stops it: the port refuses."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    port = sock.getsockname()[1]
    manager = SessionManager(SessionManager.Config(owner=f"test-{port}"), FakeBackend())
    server = uvicorn.Server(uvicorn.Config(create_app(manager, token=None), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive(), "the gateway did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}", port
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def _clients(*urls: str) -> list[SandboxClient]:
    return [SandboxClient(SandboxClient.Config(base_url=url, timeout_s=5.0)) for url in urls]


async def _on(envs: GatewayEnvironments, url: str) -> int:
    return int(envs.load()[url]["active"])


async def test_a_worker_prefers_its_own_gateway_and_uses_the_other_only_when_it_is_full() -> None:
    """Each rollout host lists every gateway, its own preferred: the other host's gateway takes
    episodes only while the own one has no room, even though it is less loaded."""
    with _real_gateway() as (own, _), _real_gateway() as (other, _):
        clients = _clients(own, other)
        envs = GatewayEnvironments(
            clients, GatewayEnvironments.Config(preferred=(own,), max_sessions_per_gateway=3)
        )
        sessions = [await envs.open(_task(), cpus=1, memory_mb=256) for _ in range(3)]
        assert (await _on(envs, own), await _on(envs, other)) == (3, 0)
        spill = await envs.open(_task(), cpus=1, memory_mb=256)  # the own one is full
        assert spill.endpoint()[0] == other
        await sessions[0].close()  # room again at home: new episodes go there
        back = await envs.open(_task(), cpus=1, memory_mb=256)
        assert back.endpoint()[0] == own and (await _on(envs, own), await _on(envs, other)) == (3, 1)
        for session in (*sessions[1:], spill, back):
            await session.close()
        for client in clients:
            await client.aclose()


async def test_a_down_own_gateway_is_routed_around_and_used_again_once_it_is_back() -> None:
    """The own gateway stops (its process died): new episodes go to the other host's gateway at
    once; after `down_for_s` the own one is probed, and once it answers it is preferred again."""
    with contextlib.ExitStack() as stack, _real_gateway() as (other, _):
        own, port = stack.enter_context(_real_gateway())
        clients = _clients(own, other)
        envs = GatewayEnvironments(clients, GatewayEnvironments.Config(preferred=(own,), down_for_s=0.3))
        home = [await envs.open(_task(), cpus=1, memory_mb=256) for _ in range(4)]
        assert {s.endpoint()[0] for s in home} == {own}
        stack.close()  # the own gateway is gone: its port refuses
        moved = [await envs.open(_task(), cpus=1, memory_mb=256) for _ in range(2)]
        assert [s.endpoint()[0] for s in moved] == [other] * 2
        assert envs.load()[own]["up"] is False and envs.load()[own]["failures"] >= 1
        with _real_gateway(port):  # restarted on its port (systemd, the node's supervisor)
            await asyncio.sleep(0.4)
            revived = await envs.open(_task(), cpus=1, memory_mb=256)  # though it counts 4 to 2
            assert revived.endpoint()[0] == own and envs.load()[own]["up"] is True
            for session in (*home, revived):  # the restarted gateway never knew the old ones
                await session.close()
        for session in moved:
            await session.close()
        for client in clients:
            await client.aclose()


async def test_the_other_gateways_are_not_probed_while_the_own_one_serves() -> None:
    """A fallback gateway on a host that is gone costs the episodes nothing while the own
    gateway takes them: it is not probed (on a real network each probe may wait for a timeout)."""
    with _real_gateway() as (own, _):
        with socket.socket() as probe:  # a port nothing listens on
            probe.bind(("127.0.0.1", 0))
            gone = f"http://127.0.0.1:{probe.getsockname()[1]}"
        clients = _clients(own, gone)
        envs = GatewayEnvironments(clients, GatewayEnvironments.Config(preferred=(own,)))
        sessions = [await envs.open(_task(), cpus=1, memory_mb=256) for _ in range(4)]
        assert {s.endpoint()[0] for s in sessions} == {own}
        assert envs.load()[gone]["failures"] == 0 and envs.load()[gone]["backend"] is None
        for session in sessions:
            await session.close()
        for client in clients:
            await client.aclose()


def test_a_preferred_gateway_must_be_one_of_the_urls() -> None:
    with pytest.raises(ConfigError, match="sandbox.preferred"):
        SandboxConfig(urls=["http://a:1", "http://b:1"], preferred=["http://c:1"])
    with pytest.raises(ConfigError, match="sandbox.preferred"):
        GatewayEnvironments(_clients("http://a:1"), GatewayEnvironments.Config(preferred=("http://c:1",)))
