"""Builds a RolloutManager from a `RolloutConfig` (real clients), runs it, always closes.

config = RolloutConfig(data=DataConfig(path="tasks.jsonl"))   # `stacx rollout FILE` reads one
summary = asyncio.run(run_rollout(config))
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from stacx.rollout.adapters import InferenceAdapter, KafkaTrajectoryPublisher, WeightsFollower
from stacx.rollout.blackbox.adapter import is_external
from stacx.rollout.config import RolloutConfig
from stacx.rollout.data import JsonlTaskSource, ListTaskSource, build_task_set, task_samples
from stacx.rollout.errors import ConfigError, ServicesNotReadyError
from stacx.rollout.fakes import MemoryPublisher, StaticVersion
from stacx.rollout.gateways import GatewayEnvironments
from stacx.rollout.manager import RolloutManager, RolloutSummary
from stacx.rollout.progress import live_progress, metrics_line
from stacx.rollout.protocols import (
    EnvironmentFactory,
    InferenceClient,
    TaskSource,
    Tokenizer,
    TrajectoryPublisher,
    VersionSource,
)
from stacx.rollout.task_stream import KafkaTaskSource
from stacx.rollout.teacher import AggreVaTeRows, DAggerLabels, TeacherInTheLoop
from stacx.rollout.tokens import load_tokenizer, model_vocab_size
from stacx.schemas.records import TaskSample

if TYPE_CHECKING:
    from stacx.rollout.blackbox.capture import CallCapture

__all__ = ["build_source", "open_manager", "run_rollout", "wait_until_up"]

log = logging.getLogger(__name__)


def build_source(config: RolloutConfig, tasks: Sequence[TaskSample] | None = None) -> TaskSource:
    """The task source named by `config.data` (`tasks` stands in for `task_dirs`)."""
    data = config.data
    options = ListTaskSource.Config(
        samples_per_task=data.samples_per_task, epochs=data.epochs, shuffle=data.shuffle, seed=data.seed
    )
    if tasks is not None:
        return ListTaskSource(tasks, options)
    if data.path:
        return JsonlTaskSource(data.path, options)
    if data.topic:
        return KafkaTaskSource(
            KafkaTaskSource.Config(
                bootstrap_servers=config.kafka.bootstrap_servers,
                group_id=data.consumer_group,
                topic=data.topic,
                samples_per_task=data.samples_per_task,
            )
        )
    if data.source:
        task_set = build_task_set(data.source, data.source_options)
        samples = task_samples(task_set.train_tasks(), where=f"data.source {data.source}")
        return ListTaskSource(samples, options)
    raise ConfigError("data.task_dirs needs the tasks loaded by the caller (`stacx eval` does it)")


def build_inference(config: RolloutConfig) -> tuple[InferenceClient, Any]:
    """The async inference client of `stacx.rollout.inference` wrapped as an `InferenceClient`."""
    from stacx.rollout.inference.client import InferenceClient as HttpInferenceClient

    client = HttpInferenceClient(HttpInferenceClient.Config(base_url=config.inference.url))
    return InferenceAdapter(client), client


Probe = Callable[[], Awaitable[bool]]


async def wait_until_up(probes: Mapping[str, Probe], timeout_s: float, *, poll_s: float = 0.1) -> float:
    """Poll every probe (name: whether that service answers now) until all have answered; the
    seconds waited. ServicesNotReadyError naming those still silent after `timeout_s`."""
    started = time.monotonic()
    waiting = dict(probes)
    while True:
        answered = await asyncio.gather(*(probe() for probe in waiting.values()))
        waiting = {name: probe for (name, probe), up in zip(waiting.items(), answered, strict=True) if not up}
        waited = time.monotonic() - started
        if not waiting:
            return waited
        if waited >= timeout_s:
            raise ServicesNotReadyError(
                f"{', '.join(waiting)} did not answer within {timeout_s:g} s; start "
                f"{'it' if len(waiting) == 1 else 'them'} or raise inference.wait_ready_s"
            )
        await asyncio.sleep(min(poll_s, timeout_s - waited))


def build_environments(config: RolloutConfig, closers: list[Any]) -> GatewayEnvironments:
    """One gateway client per `sandbox.urls` entry behind one `GatewayEnvironments`."""
    from stacx.sandbox.client import SandboxClient

    assert config.sandbox is not None
    sandbox = config.sandbox
    clients = []
    for url in sandbox.gateway_urls():
        client = SandboxClient(
            SandboxClient.Config(base_url=url, token=sandbox.token(), timeout_s=sandbox.request_timeout_s)
        )
        closers.append(client)
        clients.append(client)
    options = GatewayEnvironments.Config(
        default_image=sandbox.image,
        idle_timeout_s=sandbox.idle_timeout_s,
        max_sessions_per_gateway=sandbox.max_sessions_per_gateway,
        down_for_s=sandbox.down_for_s,
        unresponsive_after_s=sandbox.unresponsive_after_s,
        preferred=tuple(sandbox.preferred),
    )
    environments = GatewayEnvironments(clients, options)
    closers.append(environments)
    return environments


def manager_config(config: RolloutConfig) -> RolloutManager.Config:
    """`config.manager`, its `vocab_size` read from the tokenizer directory's model config when unset."""
    manager = config.manager
    if manager.vocab_size is None and config.inference.tokenizer:
        vocab_size = model_vocab_size(config.inference.tokenizer)
        if vocab_size is not None:
            return dataclasses.replace(manager, vocab_size=vocab_size)
    return manager


def build_tokenizer(config: RolloutConfig) -> Tokenizer:
    if not config.inference.tokenizer:
        raise ConfigError("inference.tokenizer is not set; point it at the model directory")
    return load_tokenizer(config.inference.tokenizer)


@contextlib.asynccontextmanager
async def open_manager(
    config: RolloutConfig,
    *,
    tasks: Sequence[TaskSample] | None = None,
    inference: InferenceClient | None = None,
    tokenizer: Tokenizer | None = None,
    sandbox: EnvironmentFactory | None = None,
    publisher: TrajectoryPublisher | None = None,
    versions: VersionSource | None = None,
) -> AsyncIterator[RolloutManager]:
    """A manager wired to real services (any seam may be passed in instead); closes them all."""
    closers: list[Any] = []
    probes: dict[str, Probe] = {}
    try:
        if inference is None:
            inference, server = build_inference(config)
            closers.append(server)
            probes[f"the inference server at {config.inference.url}"] = server.health
        if sandbox is None and config.sandbox is not None:
            environments = build_environments(config, closers)
            urls = ", ".join(g.url for g in environments.gateways)
            probes[f"a sandbox gateway of {urls}"] = environments.any_answers
            sandbox = environments
        if publisher is None:
            publisher = (
                KafkaTrajectoryPublisher(
                    bootstrap_servers=config.kafka.bootstrap_servers, topic=config.kafka.trajectories_topic
                )
                if config.kafka.publish
                else MemoryPublisher()
            )
        if versions is None:
            versions = _versions(config)
            closers.append(versions)
            if isinstance(versions, WeightsFollower):
                if not await asyncio.to_thread(versions.wait_caught_up, 30.0):
                    log.warning(
                        "stacx.weights not read to its end in 30 s; starting at version %d",
                        versions.current(),
                    )
        if config.teacher is not None:
            inference, publisher = _with_teacher(config.teacher, inference, publisher, versions,
                                                 closers)
        if probes and config.inference.wait_ready_s > 0:  # started with them: the rest is set up by now
            waited_s = await wait_until_up(probes, config.inference.wait_ready_s)
            log.info("%s answered (waited %.1f s)", " and ".join(probes), waited_s)
        capture = build_capture(config)
        if capture is not None:
            closers.append(capture)
        manager = RolloutManager(
            manager_config(config),
            source=build_source(config, tasks),
            tokenizer=tokenizer or build_tokenizer(config),
            inference=inference,
            publisher=publisher,
            sandbox=sandbox,
            versions=versions,
            capture=capture,
        )
        try:
            yield manager
        finally:
            await manager.close()
    finally:
        for closer in reversed(closers):
            await _close(closer)


def _with_teacher(
    config: TeacherInTheLoop.Config,
    student: InferenceClient,
    publisher: TrajectoryPublisher,
    versions: VersionSource,
    closers: list[Any],
) -> tuple[InferenceClient, TrajectoryPublisher]:
    """The student's client mixed with the teacher's server; DAgger and AggreVaTe publish their
    training rows instead of the episodes."""
    from stacx.rollout.inference.client import InferenceClient as HttpInferenceClient

    assert config.url is not None
    client = HttpInferenceClient(HttpInferenceClient.Config(base_url=config.url))
    closers.append(client)
    mixed = TeacherInTheLoop(
        config, student=student, teacher=InferenceAdapter(client), scorer=client, versions=versions
    )
    rows = {"dagger": DAggerLabels, "aggrevate": AggreVaTeRows}.get(config.mode)
    return mixed, (rows(publisher) if rows is not None else publisher)


def build_capture(config: RolloutConfig) -> CallCapture | None:
    """The in-process agent proxy, when an evaluator runs a black-box scaffold."""
    if not any(is_external(e.scaffold) for e in config.manager.evaluators.values()):
        return None
    from stacx.rollout.blackbox.capture import CallCapture

    capture = CallCapture(
        CallCapture.Config(
            upstream=config.inference.url,
            tokenizer_path=config.inference.tokenizer,
            served_model_name=config.manager.model_name,
        )
    )
    capture.start()
    return capture


def _versions(config: RolloutConfig) -> VersionSource:
    if not config.kafka.follow_weights:
        return StaticVersion(0)
    return WeightsFollower(
        config.manager.model_name,
        bootstrap_servers=config.kafka.bootstrap_servers,
        topic=config.kafka.weights_topic,
        group_id=config.kafka.weights_group,
    )


async def _close(resource: Any) -> None:
    for name in ("aclose", "close"):
        method = getattr(resource, name, None)
        if method is not None:
            result = method()
            if asyncio.iscoroutine(result):
                await result
            return


def _install_signals(manager: RolloutManager, received: list[signal.Signals]) -> None:
    """SIGTERM (a service manager, `stacx run`) cancels the running episodes at once; the
    first Ctrl-C drains them (they finish), the second cancels them. `received` gets the
    first signal."""
    loop = asyncio.get_running_loop()

    def on_signal(signum: signal.Signals) -> None:
        received.append(signum)
        if signum is signal.SIGTERM or len(received) > 1:
            log.warning("stopping on %s: cancelling the running episodes", signum.name)
            manager.stop("cancel")
            return
        log.warning("stopping (drain); press Ctrl-C again to cancel running episodes")
        manager.stop("drain")

    with contextlib.suppress(NotImplementedError, RuntimeError):
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, on_signal, signum)


async def run_rollout(config: RolloutConfig, **seams: Any) -> RolloutSummary:
    """Build, run `config.num_groups` groups (or the whole source) with progress, close."""
    received: list[signal.Signals] = []
    async with open_manager(config, **seams) as manager:
        _install_signals(manager, received)
        async with live_progress(manager, enabled=config.progress):
            summary = await manager.run(config.num_groups)
        log.info("rollout finished: %s", metrics_line(manager.metrics()))
        summary.stopped_by = received[0] if received else None
        return summary
