"""bench/peer_trl.py's measuring pieces: time to target, the latency tool, the peer's episode format."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"


def _load(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def peer() -> ModuleType:
    return _load("_peer_retool")


@pytest.fixture(scope="module")
def bench(peer: ModuleType) -> ModuleType:
    return _load("peer_trl")


def _curve(*points: tuple[float, float]) -> list[dict[str, float]]:
    return [{"t_s": t, "success": s} for t, s in points]


def test_time_to_target_interpolates_between_checkpoints(bench: ModuleType) -> None:
    curve = _curve((0, 0.2), (30, 0.4), (60, 0.8))
    assert bench.time_to(curve, 0.6) == pytest.approx(45.0)
    assert bench.time_to(curve, 0.4) == pytest.approx(30.0)
    assert bench.time_to(curve, 0.1) == 0
    assert bench.time_to(curve, 0.9) is None


def _side(bench: ModuleType, system: str, curve: list[dict[str, float]], pss: int = 0) -> Any:
    """A side's run with only its success curve (and peak PSS) set (what the comparison reads)."""
    return bench.SideRun(
        system=system,
        latency=False,
        versions=[],
        trajectories=0,
        trainer_tokens=0,
        trainer_busy_s=0.0,
        peak_memory_bytes=0,
        peak_pss_bytes=pss,
        peak_pss_by_service={},
        cpu_s=0.0,
        budget_s=60,
        startup_s=0,
        curve=curve,
    )


def test_ratio_is_trl_time_over_ours_at_the_lower_final_success(bench: ModuleType) -> None:
    ours = _side(bench, "stacx", _curve((0, 0.2), (30, 0.8), (60, 0.9)))
    trl = _side(bench, "trl", _curve((0, 0.2), (30, 0.4), (60, 0.6)))
    result = bench.compare(ours, trl)
    assert result["target_success"] == 0.6
    assert result["time_to_target_s_trl"] == pytest.approx(60.0)
    assert result["time_to_target_s_ours"] == pytest.approx(20.0)
    assert result["time_to_target_ratio"] == pytest.approx(3.0)


def test_memory_ratio_is_our_summed_pss_over_trls(bench: ModuleType) -> None:
    curve = _curve((0, 0.2), (60, 0.6))
    ours, trl = _side(bench, "stacx", curve, pss=3 * 2**30), _side(bench, "trl", curve, pss=2 * 2**30)
    assert bench.compare(ours, trl)["memory_ratio"] == pytest.approx(1.5)
    unmeasured = _side(bench, "trl", curve)
    assert bench.compare(ours, unmeasured)["memory_ratio"] is None


def test_sampler_splits_shared_pages_that_summed_rss_counts_twice(bench: ModuleType) -> None:
    """Two real processes that map the same 64 MiB file: summed RSS counts it twice, summed PSS once."""
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile() as blob:
        blob.write(b"x" * (64 << 20))
        blob.flush()
        reader = ("import mmap, sys, time\n"
                  "f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n"
                  "sum(m[i] for i in range(0, len(m), 4096)); print('ready', flush=True); time.sleep(60)\n")
        argv = [sys.executable, "-c", reader, blob.name]
        procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(2)]
        try:
            for proc in procs:
                assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
            sampler = bench.MemorySampler(lambda: {f"p{i}": proc.pid for i, proc in enumerate(procs)})
            rss, pss = sampler.sample()
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    assert set(pss) == {"p0", "p1"}
    assert rss - sum(pss.values()) >= 56 << 20  # the mapped file: twice in RSS, once in PSS


def test_latency_tool_still_runs_the_code(peer: ModuleType) -> None:
    assert peer.ToolLatency(scale_s=0.0).python_command() == "python3"
    slow = peer.ToolLatency(scale_s=0.01, alpha=1.5, cap_s=0.05).python_command()
    assert slow != "python3"
    assert peer.run_tool(slow, "print(37*48+19)\n") == "1795\n"


def test_peer_prompt_ids_match_the_rollout_engine(peer: ModuleType, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from rollout.models import make_tiny_model
    from rollout.tokens import ChatFormat, HFTokenizer

    make_tiny_model(
        tmp_path,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    sampler = peer.EpisodeSampler(
        AutoTokenizer.from_pretrained(str(tmp_path)), python="python3", sampling=peer.SamplingConfig()
    )
    prompt = "What is 37*48+19?"
    ours = ChatFormat(HFTokenizer(str(tmp_path))).prompt_ids([{"role": "user", "content": prompt}])
    assert sampler.prompt_ids(prompt) == ours
    observation = sampler.encode(peer.load_task().tool_response_text("1795\n"))
    from rollout.scaffolds import ToolCallingScaffold

    template = ToolCallingScaffold().response_template.replace("{output}", "1795\n")
    assert observation == sampler.encode(template)
