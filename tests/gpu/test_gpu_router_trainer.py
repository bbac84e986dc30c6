"""On a CUDA GPU: two SGLang servers behind `stacx route` (sglang-router: a group stays on one
server, a stopped server is routed around), and the FSDP2 trainer on NCCL with bf16, activation
checkpointing and CPU offload. Fails (never skips) where CUDA or SGLang is missing; collected
only with STACX_GPU_TESTS=1 (tests/gpu/run_on_device.sh)."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from stacx.rollout.inference.sglang import SGLangServer, unavailable_reason
from stacx.rollout.models import make_tiny_model

pytestmark = pytest.mark.gpu

SHAPE = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2}


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _require_sglang() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.fail(f"SGLang cannot run on this machine: {reason}", pytrace=False)


def test_two_sglang_servers_behind_the_router(tmp_path: Path) -> None:
    """sglang-router (`stacx route`) over two SGLang servers: the 4 samples of one prompt reach one
    server; that server stopped, the prompt is served by the other. Each server reports its own
    weight version (s0, s1), which tells which one answered."""
    _require_sglang()
    model = make_tiny_model(tmp_path / "m", seed=0, **SHAPE)
    servers = [SGLangServer(SGLangServer.Config(
        model_path=str(model), port=_port(), dtype="bfloat16", weight_version=f"s{i}",
        mem_fraction_static=0.15, extra_args=["--disable-cuda-graph", "--log-level", "warning"]))
        for i in range(2)]
    router_port = _port()
    router = f"http://127.0.0.1:{router_port}"
    route = None
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready(timeout_s=600)
        route = subprocess.Popen([sys.executable, "-m", "stacx.infra.cli", "route",
                                  "--port", str(router_port),
                                  *(a for s in servers for a in ("--upstream", s.base_url))])
        deadline = time.monotonic() + 120
        while not _ok(f"{router}/readiness"):  # every server registered and healthy
            assert time.monotonic() < deadline and route.poll() is None, "the router did not start"
            time.sleep(0.5)
        body = {"input_ids": list(range(10, 90)), "sampling_params": {"max_new_tokens": 8}}
        with httpx.Client(timeout=120) as http:
            versions = {_version(http.post(f"{router}/generate", json=body)) for _ in range(4)}
            assert len(versions) == 1, versions  # one group, one server
            busy = int(versions.pop()[1])
            servers[busy].stop()
            answer = http.post(f"{router}/generate", json=body)
            assert answer.status_code == 200, answer.text
            assert _version(answer) == f"s{1 - busy}"
    finally:
        if route is not None:
            route.terminate()
            route.wait(30)
        for server in servers:
            server.stop()


def _version(answer: httpx.Response) -> str:
    assert answer.status_code == 200, answer.text
    return str(json.loads(answer.content)["meta_info"]["weight_version"])


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_fsdp2_on_nccl_with_bf16_checkpointing_and_offload(tmp_path: Path) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU is visible to torch", pytrace=False)
    from stacx.trainer import BackendConfig
    from stacx.trainer.distributed import spawn
    from stacx.trainer.testing import run_jobs, synthetic_batches, tiny_trainer_config

    batches = synthetic_batches(2, num_groups=2, group_size=2, ragged=False)
    results = {}
    variants = {"plain": {}, "memory": {"activation_checkpointing": True, "cpu_offload": True}}
    for name, extra in variants.items():
        backend = BackendConfig(kind="fsdp2", world_size=1, device="cuda", mixed_precision=True, **extra)
        out = tmp_path / f"{name}.json"
        config = tiny_trainer_config("grpo", tmp_path / name, backend=backend)
        spawn(run_jobs, 1, [(config, batches, 2, str(out))])
        results[name] = json.loads(out.read_text())
    assert all(math.isfinite(v) for v in results["plain"] + results["memory"])
    assert results["memory"] == pytest.approx(results["plain"], rel=2e-2, abs=1e-3)
