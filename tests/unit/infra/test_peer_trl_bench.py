"""bench/peer_trl.py's measuring pieces: time to target, the latency tool, the peer's episode format."""

from __future__ import annotations

import importlib.util
import os
import signal
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
    ts, success = [0, 30, 60], [0.2, 0.4, 0.8]
    assert bench.time_to(ts, success, 0.6) == pytest.approx(45.0)
    assert bench.time_to(ts, success, 0.4) == pytest.approx(30.0)
    assert bench.time_to(ts, success, 0.1) == 0
    assert bench.time_to(ts, success, 0.9) is None


def test_auc_is_the_mean_success_over_the_budget(bench: ModuleType) -> None:
    # trapezoids: (0 + 0.5) / 2 * 10 + (0.5 + 0.5) / 2 * 10 = 7.5 over 20 s
    assert bench.auc([0, 10, 20], [0.0, 0.5, 0.5]) == pytest.approx(0.375)
    # uneven checkpoints: (0.2 + 0.4) / 2 * 10 + (0.4 + 1.0) / 2 * 30 = 24 over 40 s
    assert bench.auc([0, 10, 40], [0.2, 0.4, 1.0]) == pytest.approx(0.6)


def test_band_is_the_exact_seed_bootstrap_of_the_mean(bench: ModuleType) -> None:
    # two seeds, 0 and 1: the four ordered resamples have means 0, 0.5, 0.5, 1; numpy's linear
    # percentiles of those: 2.5 % -> 0.075 * 0.5 = 0.0375, 97.5 % -> 1 - 0.0375
    got = bench.band([[0.0, 0.2], [1.0, 0.2]])
    assert got["mean"] == pytest.approx([0.5, 0.2])
    assert got["lo"] == pytest.approx([0.0375, 0.2])
    assert got["hi"] == pytest.approx([0.9625, 0.2])
    assert len(bench.seed_resamples(3, draws=10, rng=None)) == 27  # 3**3 ordered draws


def test_race_stats_ratios_by_hand(bench: ModuleType) -> None:
    ts = [0, 30, 60]
    ours = [[0.2, 0.8, 0.9], [0.2, 0.8, 0.9]]  # identical seeds: every interval is the point
    trl = [[0.2, 0.4, 0.6], [0.2, 0.4, 0.6]]
    got = bench.race_stats(ts, ours, trl)
    assert got["target_success"] == pytest.approx(0.6)  # the lower final mean
    assert got["time_to_target_s_ours"] == pytest.approx(20.0)  # 0.2 -> 0.8 over 0..30 s
    assert got["time_to_target_s_trl"] == pytest.approx(60.0)
    assert got["time_to_target_ratio"] == pytest.approx(3.0)
    assert got["time_to_target_ratio_ci95"] == pytest.approx([3.0, 3.0])
    # AUC: ours (0.5 * 30 + 0.85 * 30) / 60 = 0.675, TRL (0.3 * 30 + 0.5 * 30) / 60 = 0.4
    assert got["auc_ratio"] == pytest.approx(0.675 / 0.4, abs=1e-3)
    assert got["auc_ratio_ci95"] == pytest.approx([1.6875, 1.6875], abs=1e-4)


def test_race_stats_interval_spans_the_seeds(bench: ModuleType) -> None:
    """Two TRL seeds ending at 0.4 and 0.8, the target taken from each resample's lower final
    mean: the slow seed twice is the slowest resample, the fast one twice the fastest."""
    ts = [0, 30, 60]
    ours = [[0.0, 0.8, 0.8]]
    trl = [[0.0, 0.2, 0.4], [0.0, 0.4, 0.8]]
    got = bench.race_stats(ts, ours, trl)
    # point: TRL mean (0, 0.3, 0.6), target 0.6 -> TRL 60 s, ours 22.5 s
    assert got["time_to_target_ratio"] == pytest.approx(60 / 22.5, abs=1e-3)
    lo, hi = got["time_to_target_ratio_ci95"]
    # resamples: (slow, slow) target 0.4 -> 60 / 15 = 4; (fast, fast) target 0.8 -> 60 / 30 = 2;
    # mixed (twice) -> 60 / 22.5; numpy's linear percentiles of [2, 2.667, 2.667, 4]
    assert lo == pytest.approx(2 + 0.075 * (8 / 3 - 2), abs=1e-3)
    assert hi == pytest.approx(4 - 0.075 * (4 - 8 / 3), abs=1e-3)
    assert got["ratio_defined_fraction"] == 1.0


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


def test_memory_ratio_is_our_summed_pss_over_trls(bench: ModuleType) -> None:
    curve = _curve((0, 0.2), (60, 0.6))
    ours = [_side(bench, "stacx", curve, pss=3 * 2**30), _side(bench, "stacx", curve, pss=2 * 2**30)]
    trl = [_side(bench, "trl", curve, pss=2 * 2**30), _side(bench, "trl", curve, pss=1 * 2**30)]
    assert bench.memory_ratio(ours + trl) == pytest.approx(1.5)  # each side's highest peak
    assert bench.memory_ratio([*ours, _side(bench, "trl", curve)]) is None


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


def test_sampler_counts_a_process_under_two_named_roots_once(bench: ModuleType) -> None:
    """A service forked by the preloader is in the preloader's tree and is a named root itself: its
    memory counts once, under its own name (counted under both, the STACX side's peak doubled)."""
    import subprocess

    child = "b = bytearray(48 << 20); print('ready', flush=True); import time; time.sleep(60)"
    parent = (f"import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', {child!r}], "
              "stdout=subprocess.PIPE, text=True); "
              "print(p.pid, p.stdout.readline().strip(), flush=True); p.wait()")
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    child_pid, ready = proc.stdout.readline().split()
    try:
        assert ready == "ready"
        sampler = bench.MemorySampler(lambda: {"preload": proc.pid, "trainer": int(child_pid)})
        rss, pss = sampler.sample()
    finally:
        os.kill(int(child_pid), signal.SIGKILL)
        proc.kill()
        proc.wait()
    assert pss["trainer"] >= 48 << 20
    assert pss["preload"] < 40 << 20  # the parent alone, not the child again
    assert sum(pss.values()) <= rss + (4 << 20)


def test_sampler_tells_which_processes_loaded_torch(bench: ModuleType) -> None:
    """Two real processes, one that imported torch and one that did not: the sampler's per-process
    summary marks only the first, each with its own peak PSS."""
    import subprocess

    script = "{} print('ready', flush=True); import time; time.sleep(60)"
    argv = {name: [sys.executable, "-c", script.format(code)]
            for name, code in (("torch", "import torch;"), ("plain", "b = bytearray(32 << 20);"))}
    procs = {name: subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for name, cmd in argv.items()}
    try:
        for proc in procs.values():
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        sampler = bench.MemorySampler(lambda: {name: proc.pid for name, proc in procs.items()})
        sampler.sample()
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
    summary = sampler.process_summary()
    assert [p["torch"] for p in summary["torch"]] == [True]
    assert [p["torch"] for p in summary["plain"]] == [False]
    assert summary["plain"][0]["peak_pss_mib"] >= 32
    assert summary["torch"][0]["pid"] == procs["torch"].pid


def test_latency_tool_still_runs_the_code(peer: ModuleType) -> None:
    assert peer.ToolLatency(scale_s=0.0).python_command() == "python3"
    slow = peer.ToolLatency(scale_s=0.01, alpha=1.5, cap_s=0.05).python_command()
    assert slow != "python3"
    assert peer.run_tool(slow, "print(37*48+19)\n") == "1795\n"


def test_peer_prompt_ids_match_the_rollout_engine(peer: ModuleType, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from stacx.rollout.models import make_tiny_model
    from stacx.rollout.tokens import ChatFormat, HFTokenizer

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
    from stacx.rollout.scaffolds import ToolCallingScaffold

    template = ToolCallingScaffold().response_template.replace("{output}", "1795\n")
    assert observation == sampler.encode(template)


def test_sampler_stops_at_its_deadline_between_turns(peer: ModuleType, tmp_path: Path) -> None:
    """The TRL side's sampler raises BudgetSpent once its deadline has passed (a step that would
    end after the budget is not waited for) and samples as before without one."""
    import time

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stacx.rollout.models import make_tiny_model

    make_tiny_model(tmp_path, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    sampler = peer.EpisodeSampler(AutoTokenizer.from_pretrained(str(tmp_path)), python="python3",
                                  sampling=peer.SamplingConfig(max_new_tokens=4, max_turns=2))
    assert len(sampler.sample(model, ["What is 1+1?"])) == 1
    sampler.deadline = time.time() + 3600
    assert len(sampler.sample(model, ["What is 1+1?"])) == 1
    sampler.deadline = time.time() - 1
    with pytest.raises(peer.BudgetSpent):
        sampler.sample(model, ["What is 1+1?"])


def test_recorded_latency_draws_from_the_sample_seeded_by_the_call(peer: ModuleType) -> None:
    """The delay is a value of the recorded sample (0.3 s or 0.6 s here), the same for the same call
    and seed (so both systems see the same), and the code still runs."""
    import time

    assert peer.ToolLatency(model="recorded").python_command() == "python3"  # no sample: no delay
    command = peer.ToolLatency(model="recorded", samples_s=[0.3, 0.6], seed=7).python_command()

    def timed(code: str) -> tuple[str, float]:
        t = time.monotonic()
        out = peer.run_tool(command, code)
        return out, time.monotonic() - t

    first, t1 = timed("print(6*7)\n")
    again, t2 = timed("print(6*7)")  # the same call, without the trailing newline
    assert first == again == "42\n"
    assert t1 >= 0.3 and t2 >= 0.3
    assert (t1 >= 0.6) == (t2 >= 0.6)  # the same draw both times
    seeded = {
        peer.ToolLatency(model="recorded", samples_s=[0.0, 1.0], seed=s).python_command() for s in (0, 1)
    }
    assert len(seeded) == 2  # the seed is part of the command


def test_chain_task_needs_two_calls_and_keeps_heldout_apart(peer: ModuleType) -> None:
    import random

    chain = peer.load_task(peer.REPO_ROOT / "examples" / "quickstart" / "chain.py")
    tasks = chain.ChainTasks(num_train=256, num_heldout=512)
    assert len(tasks.heldout) == 512 and not tasks.exclude & {p.expression for p in tasks.train}
    problem = tasks.heldout[0]
    assert eval(problem.expression) == problem.answer  # noqa: S307 (our own arithmetic)
    segments = chain.demonstration(problem, random.Random(0), chain.DemonstrationConfig(tool_fraction=1.0))
    assert len(segments) == 5  # call, response, call on the first result, response, answer
    second = segments[2][len("<tool_call>") : -len("</tool_call>")]
    assert second == f"print({problem.inner_value}+{problem.outer})"
    assert peer.run_tool("python3", second) == f"{problem.answer}\n"
    assert chain.reward(segments[-1], problem.answer) == 1.0
    again = chain.make_problems(8, seed=3)
    assert [p.expression for p in chain.make_problems(8, seed=3)] == [p.expression for p in again]


def test_scorer_inline_tool_prints_what_python_prints(peer: ModuleType) -> None:
    """The scorer's shortcut answers plain integer arithmetic exactly as `python3 -` does and
    leaves everything else (powers, leading zeros, other code) to a real process."""
    for code in ("print(37*48+19)", "print(1795+56*71)", "print((37*48-9)+56*71)", "print(3*-2)"):
        assert peer.inline_arithmetic(code) == peer.run_tool("python3", code)
    for code in ("print(9**99)", "print(07+1)", "import os", "print(1-)", "print(2.5*2)", "x=1"):
        assert peer.inline_arithmetic(code) is None


def test_race_run_caps_its_versions_and_publishes_one_pass_of_tasks(
    bench: ModuleType, tmp_path: Path
) -> None:
    """The STACX side's step cap lies far above what its budget allows (one version a second), so
    the budget stops it; and its tasks topic gets one pass over the 4,096 training tasks, not 16."""
    from stacx.infra.pipeline.orchestrator import Pipeline

    base = bench.load_spec(bench.RACE_CONFIG)
    cfg = bench.bench_config(base, bench.build_parser().parse_args(["--out", str(tmp_path)]))
    spec = bench.stacx_spec(base, cfg, name="peer-unit", python="python3")
    assert spec.pipeline.steps == bench.max_versions(cfg) == 110 >= 4 * 27  # 27: the most seen in 120 s
    assert Pipeline(spec)._task_passes(cfg.num_train) == 1


def test_the_start_fingerprint_changes_with_any_weight_byte_and_names_a_missing_checkpoint(
    bench: ModuleType, tmp_path: Path
) -> None:
    """Two runs share a start exactly when their SFT weights are byte-equal: one flipped byte gives
    another fingerprint, a copy the same one, and a folder without weights stops the bench."""
    import hashlib
    import shutil

    a = tmp_path / "a"
    a.mkdir()
    (a / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (a / "config.json").write_text("{}")  # not weights: not in the fingerprint
    b = tmp_path / "b"
    shutil.copytree(a, b)
    (b / "config.json").write_text('{"other": 1}')
    assert bench.weights_sha256(a) == bench.weights_sha256(b)
    expected = hashlib.sha256(b"model.safetensors" + bytes(range(256)) * 64).hexdigest()
    assert bench.weights_sha256(a) == expected
    flipped = bytearray((b / "model.safetensors").read_bytes())
    flipped[1000] ^= 1
    (b / "model.safetensors").write_bytes(bytes(flipped))
    assert bench.weights_sha256(a) != bench.weights_sha256(b)
    with pytest.raises(SystemExit, match="no \\*.safetensors"):
        bench.weights_sha256(tmp_path)


def _has_avx2() -> bool:
    """torch's own answer, in this process (no settings): the CPU runs AVX2 kernels or wider."""
    import torch

    return torch.backends.cpu.get_cpu_capability() in {"AVX2", "AVX512"}


def test_the_sft_kernel_settings_pin_a_fresh_torch_to_avx2(bench: ModuleType) -> None:
    """torch picks its CPU kernels when it loads: a process started with `sft_kernel_env()` runs
    the AVX2 ones even on an AVX-512 CPU (the start's bytes depended on that choice)."""
    import os
    import subprocess

    if not _has_avx2():
        assert bench.sft_kernel_env() == {}
        return
    pins = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert bench.sft_kernel_env() == pins
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, **bench.sft_kernel_env()},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "AVX2"


def _small_race_config(tmp_path: Path, **sft: int) -> Path:
    """The race config with a few-step SFT (the same code path, seconds instead of a minute)."""
    import yaml

    tree = yaml.safe_load((BENCH / "peer_chain.yaml").read_text())
    tree["pipeline"]["plugin_paths"] = [str(BENCH.parent / "examples")]
    tree["pipeline"]["sft"].update(sft)
    path = tmp_path / "race.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_the_sft_start_is_built_in_a_pinned_child_once_and_records_its_kernels(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _small_race_config(tmp_path, steps=3, skill_steps=2, batch_size=4, warmup_steps=1)
    spec = bench.load_spec(str(config))
    root = tmp_path / "cache"
    start = bench.build_sft(spec, root, config=config)
    assert start.name.startswith("v") and start.parent.name == "sft"
    assert list(start.glob("*.safetensors"))
    kernels = bench.built_kernels(start)
    if _has_avx2():
        assert kernels == {"torch_cpu_capability": "AVX2", **bench.SFT_KERNELS}
        assert start.parents[1].name == f"sft-{bench._sft_key(spec, bench.SFT_KERNELS)}"
        assert bench._sft_key(spec, bench.SFT_KERNELS) != bench._sft_key(spec, {})
    else:
        assert set(kernels) == {"torch_cpu_capability"}

    def no_child(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a cached start was built again")

    monkeypatch.setattr(bench.subprocess, "run", no_child)
    assert bench.build_sft(spec, root, config=config) == start
    assert bench.built_kernels(tmp_path) == "unrecorded"


def test_a_failed_sft_build_stops_the_bench_with_one_line(bench: ModuleType, tmp_path: Path) -> None:
    config = _small_race_config(tmp_path, steps=3, skill_steps=2, batch_size=4, warmup_steps=1)
    spec = bench.load_spec(str(config))
    config.write_text("pipeline: {name: [unparsable")  # the child reads the file again
    with pytest.raises(SystemExit, match="building the SFT start failed"):
        bench.build_sft(spec, tmp_path / "cache", config=config)
