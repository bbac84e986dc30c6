"""STACX vs TRL's GRPOTrainer on the same work: which gets a better policy sooner?

    .venv/bin/python bench/peer_trl.py --json                  # full: 2 x 2 runs of --budget-s each
    .venv/bin/python bench/peer_trl.py --budget-s 90 --json    # a quick check

Both sides start from the quickstart's SFT checkpoint (built once, here, with the quickstart's own
SFT code) and train GRPO on the quickstart's tool-integrated arithmetic (ReTool: `<tool_call>`
runs `python3 -` on the code, the output comes back inline, reward 1 for the exact answer) with
the same group size, prompts per step, learning rate, KL, clip, sampling limits and wall-clock
budget, one after the other on the same machine (each has all its cores):

- STACX: the quickstart pipeline's real services (sandbox gateway, inference server, Faust
  assembler, FSDP2 trainer, rollout service, all through Kafka) on free ports and its own run name;
  the only changes are the shared starting checkpoint, a wall-clock stop, and the sandbox backend
  (`process`, bubblewrap: the peer has no sandbox, and one Docker container per episode would be
  the whole story);
- TRL: `trl.GRPOTrainer` in its own virtual environment under the project's cache
  (`venv-trl-<version>`, reusing our torch and transformers through a .pth so nothing multi-GB is
  downloaded and nothing of ours is changed), with the ReTool episode in its `rollout_func` hook.

Each side is run twice: plain tool calls, and tool calls with heavy-tailed latency (Pareto). Every
policy version is saved with its wall time; afterwards the version each side had at the fixed
wall-clock checkpoints is scored on the same held-out problems with the same sampler and seed.
Last line (JSON): time_to_target_ratio (TRL's time to the target success / ours; target = the lower
of the two final successes) and success_at_budget_ours / _trl, without and with latency, plus
throughput, trainer idle fraction, peak memory (memory_ratio: our summed PSS over TRL's, and our
PSS per service) and both sides' settings side by side.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0]).resolve() == _HERE:  # run as a script: the packages, not bench/'s namesakes
    sys.path[0] = str(_HERE.parent)

import argparse  # noqa: E402
import copy  # noqa: E402
import hashlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from types import ModuleType, SimpleNamespace  # noqa: E402
from typing import Any  # noqa: E402

from infra.paths import stacx_home  # noqa: E402
from infra.pipeline.config import PipelineSpec, load_spec, parse_spec  # noqa: E402
from infra.pipeline.monitor import RunMetrics  # noqa: E402
from infra.pipeline.orchestrator import Pipeline  # noqa: E402
from infra.sidevenv import SideVenvError, ensure_side_venv  # noqa: E402
from schemas.records import TrainingBatch, WeightVersion  # noqa: E402


def _load_peer() -> ModuleType:
    """bench/_peer_retool.py (bench/ is not a package; the TRL venv runs that file too)."""
    if "_peer_retool" not in sys.modules:
        spec = importlib.util.spec_from_file_location("_peer_retool", _HERE / "_peer_retool.py")
        assert spec is not None and spec.loader is not None
        sys.modules["_peer_retool"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["_peer_retool"])
    return sys.modules["_peer_retool"]


peer = _load_peer()
REPO = _HERE.parent
QUICKSTART = REPO / "examples" / "quickstart.yaml"
TRL_VERSION = "1.16.0"
TASK = "arithmetic_tool"


# ----------------------------------------------------------------------------- TRL's venv


def ensure_trl_venv(version: str, *, timeout_s: float = 900.0) -> tuple[Path, float]:
    """`<STACX_HOME>/venv-trl-<version>` with `trl==<version>` (infra/sidevenv.py); returns
    (python, seconds spent)."""
    try:
        return ensure_side_venv(f"trl-{version}", [f"trl=={version}"], timeout_s=timeout_s)
    except SideVenvError as exc:
        raise SystemExit(str(exc)) from None


# ----------------------------------------------------------------------------- settings


@dataclass(kw_only=True, slots=True)
class BenchConfig:
    """What both sides share, read off examples/quickstart.yaml (and the command line)."""

    budget_s: float
    checkpoint_every_s: float
    latency: Any
    """`_peer_retool.ToolLatency`."""
    threads: int
    out: Path
    group_size: int
    prompts_per_step: int
    lr: float
    kl_beta: float
    clip_low: float
    clip_high: float
    max_grad_norm: float
    sampling: Any
    """`_peer_retool.SamplingConfig`."""
    num_train: int
    num_heldout: int
    task_seed: int
    eval_seed: int = 1234


def _evaluator(spec: PipelineSpec) -> dict[str, Any]:
    return dict(spec.rollout["manager"]["evaluators"][TASK])


def bench_config(spec: PipelineSpec, args: argparse.Namespace) -> BenchConfig:
    ev = _evaluator(spec)
    policy = (spec.trainer.get("role_options") or {}).get("policy") or {}
    optimizer = spec.trainer.get("optimizer") or {}
    return BenchConfig(
        budget_s=args.budget_s,
        checkpoint_every_s=args.checkpoint_every_s or args.budget_s / 6,
        latency=peer.ToolLatency(
            scale_s=args.latency_scale_s, alpha=args.latency_alpha, cap_s=args.latency_cap_s
        ),
        threads=os.cpu_count() or 1,
        out=Path(args.out).resolve(),
        group_size=int(spec.assembler["grouping"]["group_size"]),
        prompts_per_step=int(spec.rollout["manager"]["train_groups_per_version"]),
        lr=float(optimizer.get("lr", 1e-5)),
        kl_beta=float(policy.get("kl_beta", 0.04)),
        clip_low=float(policy.get("clip_low", 0.2)),
        clip_high=float(policy.get("clip_high", 0.2)),
        max_grad_norm=float(optimizer.get("max_grad_norm", 1.0)),
        sampling=peer.SamplingConfig(
            temperature=float(ev.get("temperature", 1.0)),
            max_new_tokens=int(ev["max_new_tokens"]),
            max_turns=int(ev["max_turns"]),
            max_tokens=int(ev["max_tokens"]),
        ),
        num_train=_arithmetic(spec).num_train,
        num_heldout=_arithmetic(spec).num_heldout,
        task_seed=_arithmetic(spec).seed,
    )


def _arithmetic(spec: PipelineSpec) -> Any:
    """The quickstart task source's settings (the peer comparison needs them)."""
    tasks = spec.pipeline.tasks
    if not tasks.source or not tasks.source.endswith("arithmetic:ArithmeticTasks"):
        raise SystemExit(f"{spec.source}: the peer benchmark needs the quickstart's task source")
    options = {"num_train": 4096, "num_heldout": 128, "seed": 0, **tasks.options}
    return SimpleNamespace(**options, model_dump=lambda: dict(options))


def _task_set(spec: PipelineSpec) -> Any:
    """The quickstart's task source, as the pipeline builds it."""
    from rollout.data import build_task_set

    for path in spec.plugin_paths:
        folder = str(path)
        if folder not in sys.path:
            sys.path.insert(0, folder)
    source = spec.pipeline.tasks.source
    assert source is not None  # `_arithmetic` checked it
    return build_task_set(source, spec.pipeline.tasks.options)


def _sft_config(spec: PipelineSpec) -> Any:
    if spec.pipeline.sft is None:
        raise SystemExit(f"{spec.source}: the peer benchmark needs pipeline.sft (the shared checkpoint)")
    return spec.pipeline.sft


def _tiny(spec: PipelineSpec) -> dict[str, Any]:
    if spec.pipeline.model.tiny is None:
        raise SystemExit(f"{spec.source}: the peer benchmark needs pipeline.model.tiny")
    return dict(spec.pipeline.model.tiny.model_dump())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stacx_spec(base: PipelineSpec, cfg: BenchConfig, *, name: str, python: str) -> PipelineSpec:
    """The quickstart config on free ports, its own run name, no periodic evaluation, every
    exported version kept, the process sandbox backend, and `python` as the tool interpreter."""
    tree: dict[str, Any] = {
        "bootstrap_servers": base.bootstrap_servers,
        "pipeline": {
            "name": name,
            "runs_dir": str(cfg.out / "runs"),
            "steps": 100_000,  # stopped by the wall-clock budget instead
            "timeout_s": cfg.budget_s + 600,
            "live": False,
            "tasks": base.pipeline.tasks.model_dump(exclude_none=True),
            "plugin_paths": [str(path) for path in base.plugin_paths],
            "model": base.pipeline.model.model_dump(exclude_none=True),
            "sft": _sft_config(base).model_dump(),
            "services": base.pipeline.services.model_dump(),
            "evaluation": {"every_versions": 0},
        },
        "gateway": {
            **copy.deepcopy(base.gateway),
            "port": free_port(),
            "backend": "process",
            "sessions": {**(base.gateway.get("sessions") or {}), "warm_pool_size": 0},
        },
        "inference": {
            **copy.deepcopy(base.inference),
            "server": {**(base.inference.get("server") or {}), "port": free_port()},
        },
        "rollout": copy.deepcopy(base.rollout),
        "assembler": copy.deepcopy(base.assembler),
        "trainer": copy.deepcopy(base.trainer),
    }
    tree["rollout"]["manager"]["evaluators"][TASK].setdefault("scaffold_options", {})["python"] = python
    tree["trainer"].setdefault("export", {})["keep_last"] = None
    return parse_spec(tree, source=f"{QUICKSTART} (peer_trl: {name})")


# ----------------------------------------------------------------------------- the shared SFT


def build_sft(spec: PipelineSpec, root: Path) -> Path:
    """The quickstart's SFT checkpoint (its own code: tiny model, demonstrations, two sft runs),
    cached under `root` by the config that shapes it."""
    from infra.pipeline.sft import DemonstrationEncoder, demonstration_batches, run_sft
    from rollout.models import make_tiny_model
    from rollout.tokens import HFTokenizer

    p = spec.pipeline
    system = str((_evaluator(spec).get("scaffold_options") or {}).get("system_prompt", ""))
    key = hashlib.sha256(
        json.dumps(
            [_tiny(spec), _sft_config(spec).model_dump(), _arithmetic(spec).model_dump(), system],
            sort_keys=True,
        ).encode()
    ).hexdigest()[:12]
    done = root / f"sft-{key}" / "ready"
    if done.exists():
        return Path(done.read_text())
    base = root / f"sft-{key}" / "base"
    make_tiny_model(base, **_tiny(spec))
    tokenizer = HFTokenizer(str(base))
    _arithmetic(spec)
    batches = demonstration_batches(
        _task_set(spec),
        DemonstrationEncoder(tokenizer=tokenizer, system_prompt=system),
        _sft_config(spec),
        end_token=tokenizer.inner.eos_token or "",
    )
    skill, mixture = batches[: p.sft.skill_steps], batches[p.sft.skill_steps :]
    model = base
    if skill:
        model = run_sft(
            model,
            base.parent,
            skill,
            lr=p.sft.lr,
            warmup_steps=p.sft.warmup_steps,
            seed=p.sft.seed,
            export_name="sft-skill",
        )
    if mixture:
        model = run_sft(
            model, base.parent, mixture, lr=p.sft.mixture_lr, seed=p.sft.seed + 1, export_name="sft"
        )
    done.write_text(str(model))
    return model


# ----------------------------------------------------------------------------- measuring


class MemorySampler:
    """Peak memory of some named process trees, sampled every `every_s` on a thread.

    Two sums: RSS (each process's resident pages, so a library mapped by five services counts five
    times) and PSS (proportional set size: a shared page is split among the processes mapping it,
    so the sum is the memory the side really holds; Linux only, RSS where smaps cannot be read).
    PSS is what the comparison uses; RSS is kept for the history of the figure. Also the peak PSS
    of each named tree, to tell where the memory goes."""

    def __init__(self, roots: Any, every_s: float = 1.0) -> None:
        self.roots = roots
        """Callable returning {name: root pid} to sum over (each with all its descendants)."""
        self.every_s = every_s
        self.peak_bytes = 0
        """Peak summed RSS."""
        self.peak_pss_bytes = 0
        self.peak_pss_by_name: dict[str, int] = {}
        self.cpu_by_pid: dict[int, float] = {}
        """Latest CPU seconds seen per process (its own plus its reaped children's)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peer-memory", daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def sample(self) -> tuple[int, dict[str, int]]:
        """(summed RSS, {name: summed PSS of its tree}) now."""
        import psutil

        rss: dict[int, int] = {}
        pss: dict[str, int] = {}
        for name, pid in self.roots().items():
            try:
                root = psutil.Process(pid)
                for proc in [root, *root.children(recursive=True)]:
                    rss[proc.pid] = proc.memory_info().rss
                    pss[name] = pss.get(name, 0) + _pss(proc, rss[proc.pid])
                    cpu = proc.cpu_times()
                    used = cpu.user + cpu.system + cpu.children_user + cpu.children_system
                    self.cpu_by_pid[proc.pid] = max(used, self.cpu_by_pid.get(proc.pid, 0.0))
            except psutil.Error:  # a process ended between listing and reading
                continue
        return sum(rss.values()), pss

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu_by_pid.values())

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            rss, pss = self.sample()
            self.peak_bytes = max(self.peak_bytes, rss)
            self.peak_pss_bytes = max(self.peak_pss_bytes, sum(pss.values()))
            for name, used in pss.items():
                self.peak_pss_by_name[name] = max(used, self.peak_pss_by_name.get(name, 0))


def _pss(proc: Any, rss: int) -> int:
    """A process's proportional set size (psutil's memory_full_info), or its RSS where the kernel
    gives no smaps (not Linux, or not allowed)."""
    import psutil

    try:
        return int(getattr(proc.memory_full_info(), "pss", rss))
    except (psutil.AccessDenied, NotImplementedError):
        return rss


@dataclass(kw_only=True, slots=True)
class TimedRunMetrics(RunMetrics):
    """RunMetrics that also keeps when each batch arrived and each version was published (epoch s)."""

    batch_events: list[tuple[float, int]] = field(default_factory=list)
    """(arrival time, tokens) per TrainingBatch."""
    version_times: dict[int, float] = field(default_factory=dict)

    def observe_batch(self, batch: TrainingBatch) -> None:
        RunMetrics.observe_batch(self, batch)
        with self.lock:
            self.batch_events.append((time.time(), int(len(batch.token_ids))))

    def observe_weights(self, version: WeightVersion) -> None:
        RunMetrics.observe_weights(self, version)
        with self.lock:
            self.version_times.setdefault(version.version, time.time())


class BudgetPipeline(Pipeline):
    """The quickstart pipeline from a given SFT checkpoint, stopped by a wall-clock budget
    (t = 0 when its services start), without held-out evaluations (done afterwards, alike for both)."""

    def __init__(self, spec: PipelineSpec, *, sft_dir: Path, budget_s: float) -> None:
        super().__init__(spec)
        self.metrics = TimedRunMetrics()
        self.sft_given = sft_dir
        self.budget_s = budget_s
        self.started_at = 0.0
        self.trajectories_at_budget = 0
        self.memory = MemorySampler(lambda: {n: s.pid for n, s in self.services.items() if s.pid is not None})

    def _sft(self) -> Path:
        self._sft_dir = self.sft_given
        return self.sft_given

    def _stages(self, refresh: Any) -> None:
        self._timed("setup_s", self._setup)
        sft_dir = self._timed("sft_s", self._sft)
        self.started_at = time.time()
        with self.memory:
            self._timed("services_s", self._start_serving, sft_dir)
            self._timed("grpo_s", self._grpo, sft_dir, refresh)

    def _follow(self, refresh: Any) -> None:
        while time.time() - self.started_at < self.budget_s:
            self.supervisor.poll()  # a crashed service is restarted, as in `stacx run`
            refresh()
            time.sleep(0.5)
        self.trajectories_at_budget = self.metrics.num_trajectories


@dataclass(kw_only=True, slots=True)
class SideRun:
    """One system's run: its policy versions over wall time and what it cost."""

    system: str
    latency: bool
    versions: list[tuple[float, str]]
    """(seconds since t = 0, checkpoint directory), in order; the first is the SFT model at 0."""
    trajectories: int
    trainer_tokens: int
    trainer_busy_s: float
    peak_memory_bytes: int
    """Peak summed RSS (shared pages counted once per process)."""
    peak_pss_bytes: int
    """Peak summed PSS (shared pages split among the processes mapping them)."""
    peak_pss_by_service: dict[str, int]
    cpu_s: float
    """CPU seconds the side's processes used (sampled: a process that ends between samples loses
    its last second)."""
    budget_s: float
    startup_s: float
    """Until the first rollout could start (STACX: services up; TRL: trainer built)."""
    curve: list[dict[str, float]] = field(default_factory=list)

    def version_at(self, t: float) -> str:
        return [path for at, path in self.versions if at <= t][-1]

    def summary(self) -> dict[str, Any]:
        return {
            "policy_versions": len(self.versions) - 1,
            "trajectories_per_s": round(self.trajectories / self.budget_s, 3),
            "trainer_tokens_per_s": round(self.trainer_tokens / self.budget_s, 1),
            "trainer_idle_fraction": round(max(0.0, 1 - self.trainer_busy_s / self.budget_s), 3),
            "peak_memory_mib": round(self.peak_memory_bytes / 2**20, 1),
            "peak_pss_mib": round(self.peak_pss_bytes / 2**20, 1),
            "peak_pss_mib_by_service": {
                n: round(b / 2**20, 1) for n, b in sorted(self.peak_pss_by_service.items())},
            "cpu_s": round(self.cpu_s, 1),
            "startup_s": round(self.startup_s, 1),
            "heldout_curve": self.curve,
        }


def run_stacx(base: PipelineSpec, cfg: BenchConfig, sft_dir: Path, *, latency: bool) -> SideRun:
    python = cfg.latency.python_command() if latency else "python3"
    name = f"peer-stacx-{'lat' if latency else 'plain'}-{os.getpid()}"
    pipeline = BudgetPipeline(
        stacx_spec(base, cfg, name=name, python=python), sft_dir=sft_dir, budget_s=cfg.budget_s
    )
    pipeline.run()
    m = pipeline.metrics
    assert isinstance(m, TimedRunMetrics)
    t0, end = pipeline.started_at, pipeline.started_at + cfg.budget_s
    weights = pipeline.layout.weights_dir.resolve() / pipeline.layout.model_name
    exported = sorted(m.version_times.items())  # directory names as trainer.export writes them:
    versions = [(0.0, str(sft_dir))] + [
        (at - t0, str(weights / f"v{v:08d}")) for v, at in exported if at <= end
    ]
    busy, tokens, previous = 0.0, 0, t0
    for (arrived, num_tokens), (_, published) in zip(
        m.batch_events, sorted(m.version_times.items()), strict=False
    ):
        if published > end:
            break
        busy += max(0.0, published - max(arrived, previous))  # the trainer worked from max(..) to publish
        tokens += num_tokens
        previous = published
    return SideRun(
        system="stacx",
        latency=latency,
        versions=versions,
        trajectories=pipeline.trajectories_at_budget,
        trainer_tokens=tokens,
        trainer_busy_s=busy,
        peak_memory_bytes=pipeline.memory.peak_bytes,
        peak_pss_bytes=pipeline.memory.peak_pss_bytes,
        peak_pss_by_service=dict(pipeline.memory.peak_pss_by_name),
        cpu_s=pipeline.memory.cpu_s,
        budget_s=cfg.budget_s,
        startup_s=pipeline.timings.get("services_s", 0.0),
    )


def run_trl(python: Path, cfg: BenchConfig, sft_dir: Path, *, latency: bool) -> SideRun:
    out = cfg.out / f"trl-{'lat' if latency else 'plain'}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    started = time.time()
    settings = peer.TrlSettings(
        sft_dir=str(sft_dir),
        out_dir=str(out),
        started_at=started,
        budget_s=cfg.budget_s,
        python=cfg.latency.python_command() if latency else "python3",
        threads=cfg.threads,
        num_train=cfg.num_train,
        heldout_seed=10_000 + cfg.task_seed,
        num_heldout=cfg.num_heldout,
        task_seed=cfg.task_seed,
        group_size=cfg.group_size,
        prompts_per_step=cfg.prompts_per_step,
        lr=cfg.lr,
        kl_beta=cfg.kl_beta,
        clip_low=cfg.clip_low,
        clip_high=cfg.clip_high,
        max_grad_norm=cfg.max_grad_norm,
        seed=cfg.task_seed,
        sampling=asdict(cfg.sampling),
    )
    (out / "settings.json").write_text(json.dumps(asdict(settings)))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(cfg.threads),
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }
    argv = [str(python), str(_HERE / "_peer_retool.py"), "trl", str(out / "settings.json")]
    with open(out / "trl.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        with MemorySampler(lambda: {"trl": proc.pid}) as memory:
            try:
                proc.wait(timeout=cfg.budget_s + 600)
            finally:
                if proc.poll() is None:
                    proc.kill()
    if proc.returncode != 0:
        raise SystemExit(
            f"the TRL run failed (exit {proc.returncode}); see {out / 'trl.log'}:\n"
            + (out / "trl.log").read_text()[-3000:]
        )
    result = json.loads((out / "result.json").read_text())
    end = started + cfg.budget_s
    versions = [(0.0, str(sft_dir))] + [
        (v["at"] - started, v["path"]) for v in result["versions"] if v["at"] <= end
    ]
    last = (
        [v for v in result["versions"] if v["at"] <= end] or [{"trajectories": 0, "tokens": 0, "busy_s": 0.0}]
    )[-1]
    return SideRun(
        system="trl",
        latency=latency,
        versions=versions,
        trajectories=int(last["trajectories"]),
        trainer_tokens=int(last["tokens"]),
        trainer_busy_s=float(last["busy_s"]),
        peak_memory_bytes=memory.peak_bytes,
        peak_pss_bytes=memory.peak_pss_bytes,
        peak_pss_by_service=dict(memory.peak_pss_by_name),
        cpu_s=memory.cpu_s,
        budget_s=cfg.budget_s,
        startup_s=result["ready_at"] - started,
    )


# ----------------------------------------------------------------------------- scoring


class Scorer:
    """Held-out success of checkpoints: the same problems, sampler and seed for every one (cached)."""

    def __init__(self, cfg: BenchConfig, tokenizer_dir: Path) -> None:
        task = peer.load_task()
        self.problems = task.make_problems(cfg.num_heldout, seed=10_000 + cfg.task_seed)
        self.cfg = cfg
        self.tokenizer_dir = str(tokenizer_dir)
        self.cache: dict[str, dict[str, float]] = {}

    def score(self, model_dir: str) -> dict[str, float]:
        if model_dir not in self.cache:
            self.cache[model_dir] = peer.evaluate_checkpoint(
                model_dir,
                self.tokenizer_dir,
                self.problems,
                sampling=self.cfg.sampling,
                seed=self.cfg.eval_seed,
                threads=self.cfg.threads,
            )
        return self.cache[model_dir]

    def curve(self, run: SideRun) -> list[dict[str, float]]:
        points, t = [], 0.0
        while t <= run.budget_s + 1e-6:
            scored = self.score(run.version_at(t))
            points.append(
                {
                    "t_s": round(t, 1),
                    "success": round(scored["success"], 4),
                    "tool_rate": round(scored["tool_rate"], 4),
                }
            )
            t += self.cfg.checkpoint_every_s
        return points


def time_to(curve: list[dict[str, float]], target: float) -> float | None:
    """First wall time the held-out success reaches `target` (linear between checkpoints)."""
    for before, after in zip(curve, curve[1:], strict=False):
        if before["success"] >= target:
            return before["t_s"]
        if after["success"] >= target:
            gain = after["success"] - before["success"]
            return before["t_s"] + (after["t_s"] - before["t_s"]) * (target - before["success"]) / gain
    return curve[-1]["t_s"] if curve and curve[-1]["success"] >= target else None


def compare(ours: SideRun, trl: SideRun) -> dict[str, Any]:
    target = min(ours.curve[-1]["success"], trl.curve[-1]["success"])
    t_ours, t_trl = time_to(ours.curve, target), time_to(trl.curve, target)
    ratio = None if not t_ours or t_trl is None else round(t_trl / t_ours, 3)
    return {
        "target_success": target,
        "time_to_target_s_ours": t_ours,
        "time_to_target_s_trl": t_trl,
        "time_to_target_ratio": ratio,
        "success_at_budget_ours": ours.curve[-1]["success"],
        "success_at_budget_trl": trl.curve[-1]["success"],
        "memory_ratio": round(ours.peak_pss_bytes / trl.peak_pss_bytes, 3) if trl.peak_pss_bytes else None,
    }


def plot(path: Path, runs: list[SideRun]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for run in runs:
        ax.plot(
            [p["t_s"] for p in run.curve],
            [p["success"] for p in run.curve],
            marker="o",
            color="tab:blue" if run.system == "stacx" else "tab:orange",
            linestyle="--" if run.latency else "-",
            label=f"{'STACX' if run.system == 'stacx' else 'TRL GRPOTrainer'}"
            f"{', heavy-tailed tool latency' if run.latency else ''}",
        )
    ax.set_xlabel("wall time since start (s)")
    ax.set_ylabel("held-out success (128 problems)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("STACX vs TRL GRPOTrainer: same checkpoint, task, settings and budget", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- main


def settings_side_by_side(cfg: BenchConfig, trl_python: Path) -> dict[str, Any]:
    shared = {
        "start_checkpoint": "quickstart SFT (examples/quickstart.yaml sft + demonstrations)",
        "task": "quickstart arithmetic, tool-integrated (ReTool: python3 tool, inline <tool_response>)",
        "reward": "1 for the exact integer answer, else 0",
        "group_size": cfg.group_size,
        "prompts_per_step": cfg.prompts_per_step,
        "lr": cfg.lr,
        "lr_schedule": "constant, no warmup",
        "optimizer": "AdamW (0.9, 0.999), eps 1e-8, no weight decay",
        "max_grad_norm": cfg.max_grad_norm,
        "kl_beta": cfg.kl_beta,
        "clip": [cfg.clip_low, cfg.clip_high],
        "loss_aggregation": "per-sequence token mean, then mean",
        "advantages": "group mean / std",
        "sampling": asdict(cfg.sampling),
        "cpu_cores": cfg.threads,
        "budget_s": cfg.budget_s,
    }
    return {
        "stacx": {
            **shared,
            "mode": "asynchronous services through Kafka, max_staleness 1",
            "generation": "built-in inference server (1 thread, batch <= 64)",
            "trainer": "FSDP2, 2 CPU ranks, fp32",
            "tool": "python3 in a bubblewrap sandbox (process backend)",
        },
        "trl": {
            **shared,
            "mode": f"trl {TRL_VERSION} GRPOTrainer, synchronous, one process, on-policy",
            "generation": f"transformers generate via rollout_func ({cfg.threads} torch threads)",
            "trainer": "accelerate on CPU, fp32",
            "tool": "python3 child process, a turn's calls run concurrently",
            "venv": str(trl_python.parents[1]),
        },
        "tool_latency": {"distribution": "min(cap, scale * Pareto(alpha)) per call", **asdict(cfg.latency)},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=240.0, help="wall-clock budget of each run")
    parser.add_argument("--checkpoint-every-s", type=float, default=0.0, help="default: budget / 6")
    parser.add_argument("--latency", choices=["both", "off", "on"], default="both")
    parser.add_argument("--latency-scale-s", type=float, default=0.2)
    parser.add_argument("--latency-alpha", type=float, default=1.5)
    parser.add_argument("--latency-cap-s", type=float, default=10.0)
    parser.add_argument(
        "--sft-from",
        default="",
        help="an SFT export of the same quickstart config (runs/NAME/models/sft/v*), copied; default: build",
    )
    parser.add_argument("--config", default=str(QUICKSTART))
    parser.add_argument("--out", default=str(REPO / "runs" / "peer-trl"))
    parser.add_argument("--png", default="", help="default: <out>/peer_trl.png")
    parser.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
    args = parser.parse_args(argv)

    started = time.monotonic()
    base = load_spec(args.config)
    cfg = bench_config(base, args)
    cfg.out.mkdir(parents=True, exist_ok=True)
    trl_python, venv_s = ensure_trl_venv(TRL_VERSION)
    print(f"[peer_trl] TRL venv {trl_python.parents[1]} ({venv_s:.0f}s to build)", flush=True)
    t = time.monotonic()
    if args.sft_from:  # a copy: a `make demo` loop replaces its run directory
        sft_dir = cfg.out / "sft-given"
        shutil.rmtree(sft_dir, ignore_errors=True)
        shutil.copytree(args.sft_from, sft_dir)
    else:
        sft_dir = build_sft(base, stacx_home() / "peer-trl")
    sft_s = time.monotonic() - t
    print(f"[peer_trl] SFT checkpoint {sft_dir} ({sft_s:.0f}s)", flush=True)

    runs: list[SideRun] = []
    for latency in {"both": [False, True], "off": [False], "on": [True]}[args.latency]:
        for side in ("stacx", "trl"):
            if side == "stacx":
                runs.append(run_stacx(base, cfg, sft_dir, latency=latency))
            else:
                runs.append(run_trl(trl_python, cfg, sft_dir, latency=latency))
            with open(cfg.out / "sides.jsonl", "a") as saved:  # what scoring needs, kept if it fails
                saved.write(json.dumps({**asdict(runs[-1]), "at": time.time()}) + "\n")
            print(f"[peer_trl] {side} latency={latency}: {len(runs[-1].versions) - 1} versions", flush=True)
    t = time.monotonic()
    scorer = Scorer(cfg, sft_dir)
    for run in runs:
        run.curve = scorer.curve(run)
    eval_s = time.monotonic() - t
    png = Path(args.png) if args.png else cfg.out / "peer_trl.png"
    plot(png, runs)

    result: dict[str, Any] = {"benchmark": "peer_trl"}
    for latency, suffix in ((False, ""), (True, "_latency")):
        pair = [r for r in runs if r.latency == latency]
        if len(pair) == 2:
            for key, value in compare(pair[0], pair[1]).items():
                result[key + suffix] = value
            result["stacx" + suffix] = pair[0].summary()
            result["trl" + suffix] = pair[1].summary()
    result.update(
        {
            "settings": settings_side_by_side(cfg, trl_python),
            "checkpoints_scored": len(scorer.cache),
            "timings_s": {
                "trl_venv": round(venv_s, 1),
                "sft": round(sft_s, 1),
                "eval": round(eval_s, 1),
                "total": round(time.monotonic() - started, 1),
            },
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "png": str(png),
        }
    )
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
