"""Two inference servers behind sglang-router, one killed mid-run: routed around, restarted by the
pipeline's supervision, no trajectory lost.

Real processes throughout: two `stacx serve` (the built-in CPU server: the router only uses what
every engine's server speaks alike, `/generate` with `input_ids`, `/health`), one `stacx route`
(SGLang's own router, `sglang-router` from PyPI), the pipeline's `Supervisor` restarting the
killed server, a real sandbox gateway and real Kafka for the trajectories.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stacx.infra.pipeline.services import RestartPolicy, ServiceProcess, ServiceSpec, Supervisor
from stacx.rollout.adapters import InferenceAdapter, KafkaTrajectoryPublisher
from stacx.rollout.data import ListTaskSource
from stacx.rollout.evaluator import Evaluator
from stacx.rollout.fakes import StaticVersion
from stacx.rollout.inference import GenerateResult, InferenceClient, SamplingParams
from stacx.rollout.manager import RolloutManager
from stacx.rollout.tokens import HFTokenizer
from stacx.schemas.records import TaskSample, Trajectory, TrajectoryStatus

TOKEN = "router-it"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stacx.rollout.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture
def gateway(sandbox_image: str) -> Iterator[str]:
    from stacx.sandbox.backends import DockerBackend
    from stacx.sandbox.sessions import SessionManager
    from stacx.sandbox.testing import serve_gateway

    config = SessionManager.Config(owner=f"test-router-{uuid.uuid4().hex[:8]}", default_image=sandbox_image)
    with serve_gateway(DockerBackend(), token=TOKEN, config=config) as url:
        yield url


def _requests(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "stacx_inference_requests_total":
                return float(sample.value)
    raise AssertionError(f"{url}/metrics has no stacx_inference_requests_total")


def _healthy(router: str) -> dict[str, bool]:
    """sglang-router's own view: server URL -> whether its health checks pass."""
    body = httpx.get(f"{router}/workers", timeout=10).json()
    return {str(w["url"]): bool(w["is_healthy"]) for w in body["workers"]}


def _running(url: str) -> int:
    info = httpx.get(f"{url}/get_server_info", timeout=10).json()
    return int(info["internal_states"][0]["running_requests"])


def _tasks(prefix: str, num: int) -> list[TaskSample]:
    return [TaskSample(task_id=f"{prefix}-{i}", task_type="arithmetic_tool",
                       prompt=f"What is {6 + i}*7?", data=f'{{"answer": {(6 + i) * 7}}}')
            for i in range(num)]


async def _traffic_until(router: str, reached: str, clients: int = 8, limit_s: float = 60.0) -> int:
    """Distinct prompts from `clients` concurrent clients through the router (each a new random
    prompt, as a rollout's are) until the server at `reached` has served one, or `limit_s` passed.
    Returns how many requests the router answered."""
    rng = random.Random(7)
    done = asyncio.Event()
    answered = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal answered
        while not done.is_set():
            ids = [rng.randrange(2, 90) for _ in range(rng.randrange(10, 60))]
            params = {"max_new_tokens": rng.randrange(5, 40)}
            answer = await http.post(f"{router}/generate", json={"input_ids": ids, "sampling_params": params})
            assert answer.status_code == 200, answer.text
            answered += 1

    async with httpx.AsyncClient(timeout=120) as http:
        senders = [asyncio.create_task(client(http)) for _ in range(clients)]
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and await asyncio.to_thread(_requests, reached) == 0:
            await asyncio.sleep(0.2)
        done.set()
        await asyncio.gather(*senders)
    return answered


def _consume(bootstrap: str, topic: str, group: str, count: int) -> list[Trajectory]:
    from stacx.consumers import EventConsumer

    config = EventConsumer.Config(bootstrap_servers=bootstrap, group_id=group, topics=[topic])
    consumer = EventConsumer(config)
    records: list[Trajectory] = []
    try:
        for _ in range(120):
            records += [e.value for e in consumer.consume(max_records=count, timeout=1.0)]
            if len(records) >= count:
                break
    finally:
        consumer.close()
    return records


async def _rollout(router: str, gateway: str, model_dir: Path, tasks: list[TaskSample], samples: int,
                   kafka: tuple[str, str], during: object = None) -> None:
    from stacx.rollout.adapters import GatewayEnvironments
    from stacx.rollout.inference import InferenceClient
    from stacx.sandbox.client import SandboxClient

    evaluator = Evaluator.Config(scaffold="retool", scaffold_options={"system_prompt": ""}, max_turns=2,
                                 max_new_tokens=24, max_tokens=400, temperature=1.0,
                                 episode={"sandboxes": 1, "memory_mb": 256}, step={"cpu": 0.5})
    config = RolloutManager.Config(model_name="tiny", evaluators={"arithmetic_tool": evaluator},
                                   max_concurrent_episodes=8,
                                   pool={"sandboxes": 8, "cpu": 4, "memory_mb": 4096, "generations": 8})
    client = InferenceClient(InferenceClient.Config(base_url=router, max_retries=20, backoff_max_s=2.0))
    publisher = KafkaTrajectoryPublisher(bootstrap_servers=kafka[0], topic=kafka[1])
    async with SandboxClient(SandboxClient.Config(base_url=gateway, token=TOKEN)) as sandbox:
        manager = RolloutManager(
            config, source=ListTaskSource(tasks, ListTaskSource.Config(samples_per_task=samples)),
            versions=StaticVersion(0), tokenizer=HFTokenizer(str(model_dir)),
            inference=InferenceAdapter(client), sandbox=GatewayEnvironments([sandbox]), publisher=publisher,
        )
        run = asyncio.create_task(manager.run())
        if during is not None:
            await during(manager)  # type: ignore[operator]
        await asyncio.wait_for(run, 600)
    await client.close()
    with contextlib.suppress(Exception):  # the manager may have closed it already
        await publisher.close()


async def test_two_servers_one_killed_mid_run_nothing_lost(
    model_dir: Path, gateway: str, kafka_bootstrap: str, fresh_topic, fresh_group: str, tmp_path: Path
) -> None:
    ports = [_port(), _port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    supervisor = Supervisor(RestartPolicy(backoff_s=0.5, max_backoff_s=1.0))
    servers = [
        ServiceProcess(ServiceSpec(name=f"inference-{i}", ready_url=f"{url}/health", args=[
            "serve", "--model", str(model_dir), "--port", str(port), "--device", "cpu", "--threads", "1",
            "--weight-version", "0"]), tmp_path)
        for i, (port, url) in enumerate(zip(ports, urls, strict=True))
    ]
    router_port = _port()
    router = f"http://127.0.0.1:{router_port}"
    route = ServiceProcess(ServiceSpec(name="router", ready_url=f"{router}/readiness", args=[
        "route", "--port", str(router_port), "--upstream", urls[0], "--upstream", urls[1]]), tmp_path)
    try:
        for service in [*servers, route]:
            supervisor.add(service.start())
        for service in [*servers, route]:
            service.wait_ready(180)
        await _check(router, urls, servers, supervisor, gateway, model_dir,
                     kafka_bootstrap, fresh_topic("trajectories", partitions=2), fresh_group)
    finally:
        for service in [route, *servers]:
            supervisor.remove(service.spec.name)
            service.stop()


async def _check(router: str, urls: list[str], servers: list[ServiceProcess], supervisor: Supervisor,
                 gateway: str, model_dir: Path, bootstrap: str, topic: str, group: str) -> None:
    # group affinity: the four samples of one prompt, sent together, all reach one server
    before = [_requests(u) for u in urls]
    body = {"input_ids": list(range(1, 60)), "sampling_params": {"max_new_tokens": 2}}
    async with httpx.AsyncClient(timeout=120) as http:
        answers = await asyncio.gather(*(http.post(f"{router}/generate", json=body) for _ in range(4)))
    assert all(a.status_code == 200 for a in answers)
    grown = [_requests(u) - b for u, b in zip(urls, before, strict=True)]
    assert sorted(grown) == [0.0, 4.0], grown
    holder = grown.index(4.0)  # the server that holds this prompt: the victim

    kafka = (bootstrap, topic)
    killed: list[int] = []
    marks: dict[str, float] = {}
    long_answers: list[GenerateResult] = []

    async def kill_then_supervise(manager: RolloutManager) -> None:
        deadline = time.monotonic() + 300
        while manager.summary.num_episodes < 4:  # the rollout is under way on both servers
            assert time.monotonic() < deadline, "the rollout did not get going"
            await asyncio.sleep(0.05)
        # a request surely in flight at the kill: the held prompt (affinity sends it to the victim)
        # with a long completion; the router must move it to the other server
        # through the client every service uses: sglang-router answers 500 for a request whose
        # server dies under it, the client repeats it and the router sends it to the live server
        long_params = SamplingParams(max_new_tokens=3000, ignore_eos=True, temperature=0.0)
        config = InferenceClient.Config(base_url=router, max_retries=20, backoff_max_s=2.0)
        async with InferenceClient(config) as http:
            marks["other"] = _requests(urls[1 - holder])
            long = asyncio.create_task(http.generate(list(range(1, 60)), long_params))
            await asyncio.sleep(1.0)
            assert _running(urls[holder]) >= 1, "the long request is not running on its holder"
            assert not long.done(), "the long request ended before the kill"
            # the rollout's own requests on the victim (besides the 4 above and maybe the long one)
            marks["victim"] = _requests(urls[holder]) - before[holder] - 4
            killed.append(holder)
            victim = servers[holder]
            assert victim.pid is not None
            os.killpg(victim.pid, signal.SIGKILL)  # mid-request, no goodbye
            long_answers.append(await long)
        while not supervisor.poll():
            assert time.monotonic() < deadline, "the supervisor did not restart the killed server"
            await asyncio.sleep(0.2)

    num_tasks, samples = 12, 4
    await _rollout(router, gateway, model_dir, _tasks("a", num_tasks), samples, kafka, kill_then_supervise)
    name = servers[killed[0]].spec.name
    assert supervisor.restarts[name] == 1
    assert len(long_answers[0].output_ids) == 3000  # repeated on the other server
    assert _requests(urls[1 - killed[0]]) > marks["other"]
    assert marks["victim"] >= 2, "the rollout's groups did not go to both servers"

    # the restarted server is routed to again once its /health answers
    url = urls[killed[0]]
    servers[killed[0]].wait_ready(180)
    deadline = time.monotonic() + 30
    while not _healthy(router)[url]:
        assert time.monotonic() < deadline, "the router did not take the restarted server back"
        await asyncio.sleep(0.2)
    # ... and gets work again under a rollout's kind of traffic: concurrent distinct prompts (one
    # that no server holds goes to the least loaded server; the prompts served during the outage
    # stay with the survivor, which holds them now)
    answered = await _traffic_until(router, url)
    view = httpx.get(f"{router}/workers", timeout=10).text
    assert _requests(url) > 0, f"the restarted server got none of {answered} prompts in 60 s: {view}"
    await _rollout(router, gateway, model_dir, _tasks("b", 6), samples, kafka)

    expected = (num_tasks + 6) * samples
    records = _consume(bootstrap, topic, group, expected)
    assert len({r.trajectory_id for r in records}) == expected, len(records)
    bad = [(r.status, r.error) for r in records
           if r.status not in (TrajectoryStatus.COMPLETED, TrajectoryStatus.TRUNCATED)]
    assert bad == [], bad
