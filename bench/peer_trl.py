"""STACX vs TRL's GRPOTrainer on the same work: which gets a better policy sooner?

    .venv/bin/python bench/peer_trl.py --json            # default: 3 seeds x 2 sides x 2 latency settings
    .venv/bin/python bench/peer_trl.py --quick --json    # the whole path: 40 s runs, 1 seed

Both sides start from one SFT checkpoint (built once, cached, with the pipeline's own SFT code on the
config's tiny model and the task's demonstrations, its CPU kernels pinned to AVX2 so that the start
does not depend on the vector width of the machine's CPU) and train GRPO on the race task of
bench/peer_chain.yaml: two-step tool-integrated arithmetic (examples/quickstart/chain.py; ReTool:
`<tool_call>` runs `python3 -` on the code, the output comes back inline; two calls per problem, the
second on the first one's output; reward 1 for the exact answer), with the same group size, prompts
per step, learning rate, KL, clip, sampling limits and wall-clock budget, one run after the other on
the same machine (each has all its cores):

- STACX: the pipeline's real services (sandbox gateway, inference server, Faust assembler, FSDP2
  trainer, rollout service, all through Kafka) on free ports and its own run name; the only changes
  are the shared starting checkpoint, a wall-clock stop, the seed, and the sandbox backend (`process`,
  bubblewrap: the peer has no sandbox, and one Docker container per episode would be the whole story);
- TRL: `trl.GRPOTrainer` in its own virtual environment under the project's cache
  (`venv-trl-<version>`, reusing our torch and transformers through a .pth so nothing multi-GB is
  downloaded and nothing of ours is changed), with the ReTool episode in its `rollout_func` hook.

Each side runs `--seeds` times without and with added tool latency (`--latency-model pareto`:
heavy-tailed; `recorded`: a value of bench/data/tool_latency_process.json, our sandbox's recorded exec
times on this task's calls, per call; the draw is seeded by the run's seed and the call, alike on both
sides). Every policy version is saved with its wall time; afterwards the version each run had at
`--checkpoints` evenly spaced wall-clock checkpoints is scored on the task's held-out problems (512,
disjoint from training) with the same sampler and seed. Last line (JSON), per latency setting:
mean success over wall time with a 95 % seed-bootstrap band, `time_to_target_ratio` (TRL's time to
the target / ours; target = the lower of the two final mean successes) and `auc_ratio` (area under
our curve / TRL's), each with a 95 % interval; `memory_ratio` (our peak summed PSS over TRL's),
`sft_start` (the start's SHA-256, held-out success and kernels: runs compare only where these agree), the
seeds, per-run throughput, trainer idle fraction and memory, and both sides' settings side by side.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0]).resolve() == _HERE:  # run as a script: the packages, not bench/'s namesakes
    sys.path[0] = str(_HERE.parent)

import argparse  # noqa: E402
import copy  # noqa: E402
import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterable  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from types import ModuleType, SimpleNamespace  # noqa: E402
from typing import Any  # noqa: E402

from stacx.infra.paths import stacx_home  # noqa: E402
from stacx.infra.pipeline.config import PipelineSpec, load_spec, parse_spec  # noqa: E402
from stacx.infra.pipeline.monitor import RunMetrics  # noqa: E402
from stacx.infra.pipeline.orchestrator import Pipeline  # noqa: E402
from stacx.infra.sidevenv import SideVenvError, ensure_side_venv  # noqa: E402
from stacx.schemas.records import TrainingBatch, WeightVersion  # noqa: E402


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
RACE_CONFIG = _HERE / "peer_chain.yaml"
"""The default task: two tool calls per problem, 512 held-out problems (examples/quickstart/chain.py)."""
TRL_VERSION = "1.16.0"
TASK = "arithmetic_tool"
DEFAULT_BUDGET_S = 110.0
"""Per run: 12 runs (3 seeds x 2 sides x 2 latency settings) of about 115 s each and the scoring of
61 checkpoints fit in 30 minutes on 2 cores (with 120 s and 73 checkpoints it took 31)."""
DEFAULT_CHECKPOINTS = 6
"""Scored per run, t = 0 and the budget included: one every 22 s."""


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
    checkpoints: int
    """Wall-clock checkpoints scored per run, t = 0 (the shared SFT start) and the budget included."""
    seeds: list[int]
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
    task_file: str
    """The task module (problems, reward), which the TRL side and the scorer load by file."""
    trainer_ranks: int = 1
    """Our trainer's FSDP2 ranks (`trainer.backend.world_size`)."""
    off_policy: str = "none"
    """Our trainer's off-policy correction (`role_options.policy.off_policy`, docs/losses.md)."""
    eval_seed: int = 1234


def _evaluator(spec: PipelineSpec) -> dict[str, Any]:
    return dict(spec.rollout["manager"]["evaluators"][TASK])


def bench_config(spec: PipelineSpec, args: argparse.Namespace) -> BenchConfig:
    ev = _evaluator(spec)
    policy = (spec.trainer.get("role_options") or {}).get("policy") or {}
    optimizer = spec.trainer.get("optimizer") or {}
    return BenchConfig(
        budget_s=args.budget_s,
        checkpoints=args.checkpoints,
        seeds=list(range(args.seeds)),
        latency=latency_model(args),
        threads=os.cpu_count() or 1,
        out=Path(args.out).resolve(),
        group_size=int(spec.assembler["grouping"]["group_size"]),
        prompts_per_step=int(spec.rollout["manager"]["train_groups_per_version"]),
        trainer_ranks=int((spec.trainer.get("backend") or {}).get("world_size", 1)),
        off_policy=str(policy.get("off_policy", "none")),
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
        num_train=_task_options(spec).num_train,
        num_heldout=_task_options(spec).num_heldout,
        task_seed=_task_options(spec).seed,
        task_file=str(task_file(spec)),
    )


PEER_SOURCES = {"quickstart.arithmetic:ArithmeticTasks": 128, "quickstart.chain:ChainTasks": 512}
"""Task sources the peer side can run (a torch-free module of examples/quickstart/), with the
number of held-out problems each makes by default."""


RECORDED = _HERE / "data" / "tool_latency_process.json"
"""The recorded sample of our sandbox's exec times on the race task's tool calls (bench/tool_latency.py)."""


def latency_model(args: argparse.Namespace) -> Any:
    """The tool latency of the latency runs: the Pareto model or the recorded sample."""
    if args.latency_model == "pareto":
        return peer.ToolLatency(
            scale_s=args.latency_scale_s, alpha=args.latency_alpha, cap_s=args.latency_cap_s
        )
    path = Path(args.latency_sample)
    try:
        samples = [float(x) for x in json.loads(path.read_text())["exec_s"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(
            f"{path}: no recorded sample ({type(exc).__name__}: {exc}); record one with "
            "bench/tool_latency.py or pass --latency-model pareto"
        ) from None
    return peer.ToolLatency(model="recorded", samples_s=samples, cap_s=args.latency_cap_s)


def _task_options(spec: PipelineSpec) -> Any:
    """The task source's settings (the peer comparison needs them)."""
    tasks = spec.pipeline.tasks
    if tasks.source not in PEER_SOURCES:
        raise SystemExit(
            f"{spec.source}: pipeline.tasks.source {tasks.source!r} has no peer side; "
            f"use one of {', '.join(sorted(PEER_SOURCES))}"
        )
    options = {"num_train": 4096, "num_heldout": PEER_SOURCES[tasks.source], "seed": 0, **tasks.options}
    return SimpleNamespace(**options, model_dump=lambda: dict(options))


def task_file(spec: PipelineSpec) -> Path:
    """The task source's module file, found on the config's plug-in paths."""
    _task_options(spec)
    module = str(spec.pipeline.tasks.source).split(":", 1)[0]
    for folder in spec.plugin_paths:
        path = Path(folder) / (module.replace(".", "/") + ".py")
        if path.is_file():
            return path
    raise SystemExit(f"{spec.source}: {module} is on none of pipeline.plugin_paths; add examples/ there")


def _task_set(spec: PipelineSpec) -> Any:
    """The quickstart's task source, as the pipeline builds it."""
    from stacx.rollout.data import build_task_set

    for path in spec.plugin_paths:
        folder = str(path)
        if folder not in sys.path:
            sys.path.insert(0, folder)
    source = spec.pipeline.tasks.source
    assert source is not None  # `_task_options` checked it
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


def max_versions(cfg: BenchConfig) -> int:
    """The STACX side's step cap: one policy version a second (4x the fastest rate seen here), so
    the wall-clock budget stops it first; the run's tasks topic gets what that many versions can
    use (one pass over the training tasks, not 16)."""
    return max(64, int(cfg.budget_s))


def delete_own_run(bootstrap: str, run_id: str) -> None:
    """Delete the topics and consumer groups of one finished STACX run of this benchmark (its
    own run id, nothing else); a refusal is one line, and the run stays for `stacx topics`."""
    from stacx.infra.services import topic_admin
    from stacx.infra.services.errors import InfraError

    try:
        topic_admin.delete_run(bootstrap, run_id)
    except InfraError as exc:
        print(f"[peer_trl] run {run_id} kept on the broker ({exc}); delete it with "
              f"`stacx topics gc --run {run_id}`", flush=True)


def stacx_spec(
    base: PipelineSpec, cfg: BenchConfig, *, name: str, python: str, seed: int = 0
) -> PipelineSpec:
    """The config on free ports, its own run name, no periodic evaluation, every exported version
    kept, the process sandbox backend, `python` as the tool interpreter, and `seed` for the
    rollout order, the sampler and the trainer."""
    tree: dict[str, Any] = {
        "bootstrap_servers": base.bootstrap_servers,
        "pipeline": {
            "name": name,
            "runs_dir": str(cfg.out / "runs"),
            "steps": max_versions(cfg),  # stopped by the wall-clock budget first
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
            "server": {
                **(base.inference.get("server") or {}),
                "port": free_port(),
                "engine": {**((base.inference.get("server") or {}).get("engine") or {}), "seed": seed},
            },
        },
        "rollout": copy.deepcopy(base.rollout),
        "assembler": copy.deepcopy(base.assembler),
        "trainer": copy.deepcopy(base.trainer),
    }
    tree["rollout"]["manager"]["evaluators"][TASK].setdefault("scaffold_options", {})["python"] = python
    tree["trainer"].setdefault("export", {})["keep_last"] = None
    tree["trainer"]["seed"] = seed
    tree["rollout"].setdefault("data", {})["seed"] = seed
    return parse_spec(tree, source=f"{base.source} (peer_trl: {name})")


# ----------------------------------------------------------------------------- the shared SFT


SFT_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
"""The CPU kernels the SFT start is built with, on any x86-64 machine that has AVX2: torch's own
kernels, MKL's (conditional numerical reproducibility) and oneDNN's, each through its documented
setting. Left to choose, each library picks the widest vector unit it finds, which rounds
differently, and over 450 SFT steps that is another start: from the same config an AVX-512 machine
built one scoring 0.04 where other machines built 0.05 and 0.11. Pinned, that machine builds a
start scoring 0.10 (the same bytes with torch's setting alone)."""


def sft_kernel_env() -> dict[str, str]:
    """`SFT_KERNELS` where this CPU has AVX2, else nothing (other machines build natively, and
    `sft_start` in the JSON says so)."""
    try:
        flags = next(
            (line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), ""
        )
    except OSError:
        return {}
    return dict(SFT_KERNELS) if "avx2" in flags.split() else {}


def build_sft(spec: PipelineSpec, root: Path, *, config: str | Path) -> Path:
    """The race's SFT start, built once in a process of its own with the CPU kernels of
    `sft_kernel_env()` (they are chosen when torch loads) and cached under `root` by the config
    and kernels that shape it. `config` is the file `spec` was loaded from."""
    kernels = sft_kernel_env()
    folder = root / f"sft-{_sft_key(spec, kernels)}"
    done = folder / "ready"
    if done.exists():
        return Path(done.read_text())
    argv = [sys.executable, str(_HERE / "peer_trl.py"), "--config", str(config), "--sft-into", str(folder)]
    proc = subprocess.run(argv, env={**os.environ, **kernels}, cwd=REPO, check=False)
    if proc.returncode != 0 or not done.exists():
        raise SystemExit(f"building the SFT start failed (exit {proc.returncode}): {' '.join(argv)}")
    return Path(done.read_text())


def _system_prompt(spec: PipelineSpec) -> str:
    return str((_evaluator(spec).get("scaffold_options") or {}).get("system_prompt", ""))


def _sft_key(spec: PipelineSpec, kernels: dict[str, str]) -> str:
    shape = [_tiny(spec), _sft_config(spec).model_dump(), _task_options(spec).model_dump()]
    shape.append(_system_prompt(spec))
    if kernels:  # builds before the kernels were pinned keep their key
        shape.append(kernels)
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:12]


def build_sft_here(spec: PipelineSpec, folder: Path) -> Path:
    """The quickstart's SFT checkpoint (its own code: tiny model, demonstrations, two sft runs),
    built in this process into `folder`, whose `ready` file names it when done."""
    from stacx.infra.pipeline.sft import DemonstrationEncoder, demonstration_batches, run_sft
    from stacx.rollout.models import make_tiny_model
    from stacx.rollout.tokens import HFTokenizer

    sft = _sft_config(spec)
    system = _system_prompt(spec)
    base = folder / "base"
    make_tiny_model(base, **_tiny(spec))
    tokenizer = HFTokenizer(str(base))
    batches = demonstration_batches(
        _task_set(spec).demonstration,
        DemonstrationEncoder(tokenizer=tokenizer, system_prompt=system),
        sft,
        end_token=tokenizer.inner.eos_token or "",
    )
    skill, mixture = batches[: sft.skill_steps], batches[sft.skill_steps :]
    model = base
    if skill:
        model = run_sft(
            model,
            folder,
            skill,
            lr=sft.lr,
            warmup_steps=sft.warmup_steps,
            seed=sft.seed,
            export_name="sft-skill",
        )
    if mixture:
        model = run_sft(model, folder, mixture, lr=sft.mixture_lr, seed=sft.seed + 1, export_name="sft")
    import torch

    kernels = {"torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}
    kernels.update({name: os.environ[name] for name in SFT_KERNELS if name in os.environ})
    (folder / KERNELS_FILE).write_text(json.dumps(kernels, sort_keys=True))
    (folder / "ready").write_text(str(model))
    return model


KERNELS_FILE = "kernels.json"
"""Beside a built start's `ready`: the kernels torch used and the settings that pinned them."""


def built_kernels(sft_dir: Path) -> dict[str, str] | str:
    """What `build_sft_here` recorded of the kernels that built `sft_dir` (a `run_sft` export,
    `<build folder>/<name>/v<version>`); "unrecorded" for a start built elsewhere."""
    recorded = Path(sft_dir).parent.parent / KERNELS_FILE
    return json.loads(recorded.read_text()) if recorded.is_file() else "unrecorded"


def weights_sha256(model_dir: Path) -> str:
    """SHA-256 over a checkpoint's safetensors files (names and bytes, in name order): two runs
    started from the same weights exactly when these agree, so figures are compared only between
    runs whose starts agree (see `SFT_KERNELS` for why a start can differ between machines)."""
    digest = hashlib.sha256()
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise SystemExit(f"no *.safetensors in {model_dir}: not a checkpoint the race can start from")
    for path in files:
        digest.update(path.name.encode())
        with open(path, "rb") as data:
            for block in iter(lambda: data.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- measuring


class MemorySampler:
    """Peak memory of some named process trees, sampled every `every_s` on a thread.

    Two sums: RSS (each process's resident pages, so a library mapped by five services counts five
    times) and PSS (proportional set size: a shared page is split among the processes mapping it,
    so the sum is the memory the side really holds; Linux only, RSS where smaps cannot be read).
    PSS is what the comparison uses; RSS is kept for the history of the figure. Also the peak PSS
    of each named tree and of each process in it, with whether that process loaded torch, to tell
    where the memory goes."""

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
        self.processes: dict[str, dict[int, dict[str, Any]]] = {}
        """{name: {pid: {"torch", "peak_pss", "cmd"}}} of every process seen in each tree."""
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
        for name, proc in self._owned():
            try:
                rss[proc.pid] = proc.memory_info().rss
                own = _pss(proc, rss[proc.pid])
                pss[name] = pss.get(name, 0) + own
                self._note(name, proc, own)
                cpu = proc.cpu_times()
                used = cpu.user + cpu.system + cpu.children_user + cpu.children_system
                self.cpu_by_pid[proc.pid] = max(used, self.cpu_by_pid.get(proc.pid, 0.0))
            except psutil.Error:  # a process ended between listing and reading
                continue
        return sum(rss.values()), pss

    def _owned(self) -> list[tuple[str, Any]]:
        """(name, process) for every process of the trees once, under the nearest named root
        (a service forked by the preloader is in the preloader's tree and is its own root)."""
        import psutil

        trees: list[tuple[str, list[Any]]] = []
        for name, pid in self.roots().items():
            try:
                root = psutil.Process(pid)
                trees.append((name, [root, *root.children(recursive=True)]))
            except psutil.Error:
                continue
        owner: dict[int, tuple[str, Any]] = {}
        for name, procs in sorted(trees, key=lambda tree: -len(tree[1])):  # enclosing trees first
            owner.update({proc.pid: (name, proc) for proc in procs})
        return list(owner.values())

    def _note(self, name: str, proc: Any, pss: int) -> None:
        seen = self.processes.setdefault(name, {}).get(proc.pid)
        if seen is None:
            seen = {"torch": False, "peak_pss": 0, "cmd": " ".join(proc.cmdline()[:3])[-80:]}
            self.processes[name][proc.pid] = seen
        seen["torch"] = seen["torch"] or _loads_torch(proc.pid)
        seen["peak_pss"] = max(seen["peak_pss"], pss)

    def process_summary(self, min_pss_bytes: int = 8 * 2**20) -> dict[str, list[dict[str, Any]]]:
        """Per tree, the processes above `min_pss_bytes` at their peak (tool processes and shells
        are noise): pid, whether it loaded torch, peak PSS in MiB, the command's start."""
        return {
            name: [
                {
                    "pid": pid,
                    "torch": p["torch"],
                    "peak_pss_mib": round(p["peak_pss"] / 2**20, 1),
                    "cmd": p["cmd"],
                }
                for pid, p in sorted(procs.items())
                if p["peak_pss"] > min_pss_bytes
            ]
            for name, procs in sorted(self.processes.items())
        }

    def torch_processes(self) -> dict[str, int]:
        """{name: how many processes of its tree loaded torch}."""
        return {name: sum(p["torch"] for p in procs) for name, procs in self.process_summary().items()}

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


def _loads_torch(pid: int) -> bool:
    """Whether the process has torch's C++ library mapped (it imported torch)."""
    try:
        return "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


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
        self.memory = MemorySampler(self.process_roots)

    def _sft(self) -> Path:
        self._sft_dir = self.sft_given
        return self.sft_given

    def _stages(self, refresh: Any) -> None:
        self._timed("setup_s", self._setup)
        sft_dir = self._timed("sft_s", self._sft)
        self.started_at = time.time()
        with self.memory:
            self._timed("services_s", self._start_serving, sft_dir)
            self._timed("grpo_s", self._grpo, refresh)

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
    seed: int = 0
    curve: list[dict[str, float]] = field(default_factory=list)
    torch_processes_by_service: dict[str, int] = field(default_factory=dict)
    """How many of each service's processes loaded torch (where the memory goes)."""

    def version_at(self, t: float) -> str:
        return [path for at, path in self.versions if at <= t][-1]

    def summary(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "latency": self.latency,
            "seed": self.seed,
            "policy_versions": len(self.versions) - 1,
            "trajectories_per_s": round(self.trajectories / self.budget_s, 3),
            "trainer_tokens_per_s": round(self.trainer_tokens / self.budget_s, 1),
            "trainer_idle_fraction": round(max(0.0, 1 - self.trainer_busy_s / self.budget_s), 3),
            "peak_memory_mib": round(self.peak_memory_bytes / 2**20, 1),
            "peak_pss_mib": round(self.peak_pss_bytes / 2**20, 1),
            "peak_pss_mib_by_service": {
                n: round(b / 2**20, 1) for n, b in sorted(self.peak_pss_by_service.items())},
            "torch_processes_by_service": self.torch_processes_by_service,
            "cpu_s": round(self.cpu_s, 1),
            "startup_s": round(self.startup_s, 1),
            "heldout_curve": self.curve,
        }


def tool_python(cfg: BenchConfig, *, latency: bool, seed: int) -> str:
    """The tool interpreter of a run: with latency, the delay seeded by the run's seed (the same
    delays on both sides for the same call)."""
    return dataclasses.replace(cfg.latency, seed=seed).python_command() if latency else "python3"


def run_stacx(
    base: PipelineSpec, cfg: BenchConfig, sft_dir: Path, *, latency: bool, seed: int = 0
) -> SideRun:
    python = tool_python(cfg, latency=latency, seed=seed)
    name = f"peer-stacx-{'lat' if latency else 'plain'}-s{seed}-{os.getpid()}"
    pipeline = BudgetPipeline(
        stacx_spec(base, cfg, name=name, python=python, seed=seed), sft_dir=sft_dir, budget_s=cfg.budget_s
    )
    try:
        pipeline.run()
    finally:
        delete_own_run(base.bootstrap_servers, pipeline.layout.run_id)
    m = pipeline.metrics
    if m.policy_version >= max_versions(cfg):
        raise SystemExit(f"the STACX side reached its cap of {max_versions(cfg)} versions in "
                         f"{cfg.budget_s} s; raise max_versions in bench/peer_trl.py")
    assert isinstance(m, TimedRunMetrics)
    t0, end = pipeline.started_at, pipeline.started_at + cfg.budget_s
    weights = pipeline.layout.weights_dir.resolve() / pipeline.layout.model_name
    exported = sorted(m.version_times.items())  # directory names as stacx.trainer.export writes them:
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
        torch_processes_by_service=pipeline.memory.torch_processes(),
        cpu_s=pipeline.memory.cpu_s,
        budget_s=cfg.budget_s,
        startup_s=pipeline.timings.get("services_s", 0.0),
        seed=seed,
    )


def run_trl(python: Path, cfg: BenchConfig, sft_dir: Path, *, latency: bool, seed: int = 0) -> SideRun:
    out = cfg.out / f"trl-{'lat' if latency else 'plain'}-s{seed}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    started = time.time()
    settings = peer.TrlSettings(
        sft_dir=str(sft_dir),
        out_dir=str(out),
        started_at=started,
        budget_s=cfg.budget_s,
        python=tool_python(cfg, latency=latency, seed=seed),
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
        seed=seed,
        sampling=asdict(cfg.sampling),
        task_file=cfg.task_file,
    )
    (out / "settings.json").write_text(json.dumps(asdict(settings)))
    env = _worker_env(cfg.threads)
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
        torch_processes_by_service=memory.torch_processes(),
        cpu_s=memory.cpu_s,
        budget_s=cfg.budget_s,
        startup_s=result["ready_at"] - started,
        seed=seed,
    )


# ----------------------------------------------------------------------------- scoring

SCORE_THREADS = 1
"""Torch threads of each scoring process (one process per core)."""


def _worker_env(threads: int) -> dict[str, str]:
    """The environment of a TRL or scoring process: its thread count, offline, no warnings."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }


class Scorer:
    """Held-out success of checkpoints: the same problems, sampler and seed for every one (cached)."""

    def __init__(self, cfg: BenchConfig, tokenizer_dir: Path) -> None:
        self.cfg = cfg
        self.tokenizer_dir = str(tokenizer_dir)
        self.cache: dict[str, dict[str, float]] = {}

    def score(self, model_dir: str) -> dict[str, float]:
        self.score_all([model_dir])
        return self.cache[model_dir]

    def score_all(self, model_dirs: Iterable[str]) -> None:
        """Score the checkpoints not scored yet, in one single-thread process per core (on 2
        cores, two 1-thread processes scored 2.2x the checkpoints per second of one 2-thread
        process). Each checkpoint's figures depend on it alone, not on which process took it."""
        todo = sorted(set(model_dirs) - self.cache.keys())
        if not todo:
            return
        workers = max(1, min(self.cfg.threads, len(todo)))
        folder = self.cfg.out / "scoring"
        folder.mkdir(parents=True, exist_ok=True)
        jobs = [self._job(todo[k::workers], folder / f"scores-{k}.json") for k in range(workers)]
        procs = []
        try:
            for k, job in enumerate(jobs):
                job_file = folder / f"job-{k}.json"
                job_file.write_text(json.dumps(asdict(job)))
                with open(folder / f"score-{k}.log", "wb") as log:
                    argv = [sys.executable, str(_HERE / "_peer_retool.py"), "score", str(job_file)]
                    procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                  env=_worker_env(SCORE_THREADS), cwd=REPO))
            for k, (proc, job) in enumerate(zip(procs, jobs, strict=True)):
                if proc.wait() != 0:
                    log_path = folder / f"score-{k}.log"
                    raise SystemExit(f"scoring failed (exit {proc.returncode}); see {log_path}:\n"
                                     + log_path.read_text()[-3000:])
                self.cache.update(json.loads(Path(job.out).read_text()))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    def _job(self, model_dirs: list[str], out: Path) -> Any:
        return peer.ScoreJob(
            model_dirs=model_dirs,
            tokenizer_dir=self.tokenizer_dir,
            task_file=self.cfg.task_file,
            num_heldout=self.cfg.num_heldout,
            problems_seed=10_000 + self.cfg.task_seed,
            sampling=asdict(self.cfg.sampling),
            seed=self.cfg.eval_seed,
            threads=SCORE_THREADS,
            out=str(out),
        )

    def times(self) -> list[float]:
        """The wall-clock checkpoints: evenly spaced from 0 to the budget."""
        n = max(2, self.cfg.checkpoints)
        return [round(self.cfg.budget_s * k / (n - 1), 1) for k in range(n)]

    def curve(self, run: SideRun) -> list[dict[str, float]]:
        points = []
        for t in self.times():
            scored = self.score(run.version_at(t + 1e-6))
            points.append(
                {
                    "t_s": t,
                    "success": round(scored["success"], 4),
                    "tool_rate": round(scored["tool_rate"], 4),
                    "two_calls_rate": round(scored.get("two_calls_rate", 0.0), 4),
                }
            )
        return points


def time_to(ts: Any, success: Any, target: float) -> float | None:
    """First wall time the success curve (at checkpoint times `ts`) reaches `target`, linear
    between checkpoints; None when it never does."""
    points = [(float(t), float(y)) for t, y in zip(ts, success, strict=True)]
    for (t0, s0), (t1, s1) in zip(points, points[1:], strict=False):
        if s0 >= target:
            return float(t0)
        if s1 >= target:
            return float(t0 + (t1 - t0) * (target - s0) / (s1 - s0))
    return points[-1][0] if points and points[-1][1] >= target else None


def auc(ts: Any, success: Any) -> float:
    """Area under the success curve over the budget, divided by the budget (the mean success over
    wall time, trapezoids between checkpoints)."""
    import numpy as np

    t, y = np.asarray(ts, dtype=float), np.asarray(success, dtype=float)
    return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(t)) / (t[-1] - t[0]))


def seed_resamples(n: int, *, draws: int, rng: Any, exact_up_to: int = 4) -> Any:
    """Bootstrap resamples of `n` seeds (rows of seed indices): all n**n ordered draws with
    replacement when n <= exact_up_to (the exact bootstrap), else `draws` random ones."""
    import itertools

    import numpy as np

    if n <= exact_up_to:
        return np.array(list(itertools.product(range(n), repeat=n)))
    return rng.integers(0, n, size=(draws, n))


def _ci95(values: Any) -> list[float] | None:
    import numpy as np

    v = np.asarray([x for x in values if x is not None], dtype=float)
    if not len(v):
        return None
    return [round(float(np.percentile(v, 2.5)), 4), round(float(np.percentile(v, 97.5)), 4)]


def band(curves: Any) -> dict[str, list[float]]:
    """Mean success over seeds at each checkpoint (rows: seeds) with its 95 % band: the 2.5th and
    97.5th percentiles of the mean over seed resamples."""
    import numpy as np

    y = np.asarray(curves, dtype=float)
    means = y[seed_resamples(len(y), draws=4000, rng=np.random.default_rng(0))].mean(axis=1)
    return {
        "mean": [round(float(x), 4) for x in y.mean(axis=0)],
        "lo": [round(float(x), 4) for x in np.percentile(means, 2.5, axis=0)],
        "hi": [round(float(x), 4) for x in np.percentile(means, 97.5, axis=0)],
    }


def _race_point(ts: Any, ours: Any, trl: Any) -> tuple[float, float | None, float | None, float | None]:
    """(target, time_to_target_ratio, auc_ratio, t_ours) of mean curves ours, trl (rows: seeds)."""
    m_ours, m_trl = ours.mean(axis=0), trl.mean(axis=0)
    target = float(min(m_ours[-1], m_trl[-1]))
    t_ours, t_trl = time_to(ts, m_ours, target), time_to(ts, m_trl, target)
    ratio = t_trl / t_ours if t_ours and t_trl is not None else None
    a_trl = auc(ts, m_trl)
    return target, ratio, (auc(ts, m_ours) / a_trl if a_trl > 0 else None), t_ours


def race_stats(ts: Any, ours: Any, trl: Any, *, draws: int = 4000, seed: int = 0) -> dict[str, Any]:
    """Time to target and area under the curve, STACX over TRL, from each side's held-out success
    at checkpoint times `ts` (rows: seeds), with 95 % intervals from a seed bootstrap (each side's
    seeds resampled independently; exact enumeration for few seeds). time_to_target_ratio = TRL's
    time to the target / ours, target = the lower of the two final mean successes; auc_ratio = our
    area / TRL's. A resample where the ratio is undefined (target met at t = 0) is left out of its
    interval; `ratio_defined_fraction` says how many were kept."""
    import itertools

    import numpy as np

    ys, yt = np.asarray(ours, dtype=float), np.asarray(trl, dtype=float)
    rng = np.random.default_rng(seed)
    ro = seed_resamples(len(ys), draws=draws, rng=rng)
    rt = seed_resamples(len(yt), draws=draws, rng=rng)
    exact = len(ro) * len(rt) <= draws * 16
    pairs = list(itertools.product(ro, rt)) if exact else list(zip(ro, rt, strict=False))
    boot = [_race_point(ts, ys[i], yt[j]) for i, j in pairs]
    target, ratio, auc_ratio, t_ours = _race_point(ts, ys, yt)
    t_trl = time_to(ts, yt.mean(0), target)
    ratios = [b[1] for b in boot]
    return {
        "target_success": round(target, 4),
        "time_to_target_s_ours": None if t_ours is None else round(t_ours, 1),
        "time_to_target_s_trl": None if t_trl is None else round(t_trl, 1),
        "time_to_target_ratio": None if ratio is None else round(ratio, 3),
        "time_to_target_ratio_ci95": _ci95(ratios),
        "ratio_defined_fraction": round(sum(r is not None for r in ratios) / len(ratios), 3),
        "auc_ours": round(auc(ts, ys.mean(0)), 4),
        "auc_trl": round(auc(ts, yt.mean(0)), 4),
        "auc_ratio": None if auc_ratio is None else round(auc_ratio, 3),
        "auc_ratio_ci95": _ci95(b[2] for b in boot),
        "success_final_ours": round(float(ys.mean(0)[-1]), 4),
        "success_final_trl": round(float(yt.mean(0)[-1]), 4),
    }


def plot(path: Path, ts: list[float], curves: dict[str, dict[str, dict[str, list[float]]]], *,
         num_heldout: int, seeds: int, latency_label: str) -> None:
    """Mean held-out success over wall time with its 95 % band, one panel per latency setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5.2 * len(curves), 4.0), sharey=True, squeeze=False)
    for ax, (setting, sides) in zip(axes[0], curves.items(), strict=True):
        for system, b in sides.items():
            color = "tab:blue" if system == "stacx" else "tab:orange"
            label = "STACX" if system == "stacx" else "TRL GRPOTrainer"
            ax.plot(ts, b["mean"], marker="o", color=color, label=label)
            ax.fill_between(ts, b["lo"], b["hi"], color=color, alpha=0.2)
        ax.set_title(latency_label if setting == "latency" else "no added tool latency", fontsize=9)
        ax.set_xlabel("wall time since start (s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    axes[0][0].set_ylabel(f"held-out success ({num_heldout} problems)")
    axes[0][0].set_ylim(0, 1)
    fig.suptitle(
        f"STACX vs TRL GRPOTrainer (same SFT start, task, settings, budget): {seeds} seeds, 95 % band",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- main


def settings_side_by_side(cfg: BenchConfig, trl_python: Path, task_source: str) -> dict[str, Any]:
    shared = {
        "start_checkpoint": "the config's SFT (its pipeline.sft + the task's demonstrations), built once",
        "task": f"{task_source}, tool-integrated (ReTool: python3 tool, inline <tool_response>)",
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
        "seeds": cfg.seeds,
    }
    return {
        "stacx": {
            **shared,
            "mode": "asynchronous services through Kafka, max_staleness 1",
            "off_policy_correction": cfg.off_policy,
            "generation": "built-in inference server (1 thread, batch <= 64)",
            "trainer": f"FSDP2, {cfg.trainer_ranks} CPU rank(s), fp32",
            "tool": "python3 in a bubblewrap sandbox (process backend)",
            "seed_sets": "rollout order, sampler, trainer",
        },
        "trl": {
            **shared,
            "mode": f"trl {TRL_VERSION} GRPOTrainer, synchronous, one process, on-policy",
            "off_policy_correction": "none needed (on-policy: the ratio is 1)",
            "generation": f"transformers generate via rollout_func ({cfg.threads} torch threads)",
            "trainer": "accelerate on CPU, fp32",
            "tool": "python3 child process, a turn's calls run concurrently",
            "seed_sets": "GRPOConfig.seed (data order, sampler, init of the trainer's RNGs)",
            "venv": str(trl_python.parents[1]),
        },
        "tool_latency": cfg.latency.describe(),
    }


def _curves(scorer: Scorer, runs: list[SideRun]) -> dict[str, Any]:
    """{setting: {system: band}} and the statistics of each setting with both sides run."""
    ts = scorer.times()
    curves: dict[str, Any] = {}
    stats: dict[str, Any] = {}
    for latency, setting in ((False, "plain"), (True, "latency")):
        sides = {}
        for system in ("stacx", "trl"):
            mine = [r for r in runs if r.latency == latency and r.system == system]
            rows = [[p["success"] for p in r.curve] for r in mine]
            if rows:
                sides[system] = {**band(rows), "seeds": rows}
        if sides:
            curves[setting] = sides
        if len(sides) == 2:
            stats[setting] = race_stats(ts, sides["stacx"]["seeds"], sides["trl"]["seeds"])
    return {"curves": curves, "stats": stats}


def _peak_pss(runs: list[SideRun], system: str) -> int:
    return max((r.peak_pss_bytes for r in runs if r.system == system), default=0)


def memory_ratio(runs: list[SideRun]) -> float | None:
    """Our peak summed PSS over TRL's (the highest of each side's runs); None when TRL's is unmeasured."""
    theirs = _peak_pss(runs, "trl")
    return round(_peak_pss(runs, "stacx") / theirs, 3) if theirs else None


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's options (bench/pipeline_memory.py runs the STACX side with them too)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="wall-clock budget per run")
    parser.add_argument("--seeds", type=int, default=3, help="runs per side and latency setting (0..N-1)")
    parser.add_argument(
        "--checkpoints", type=int, default=DEFAULT_CHECKPOINTS, help="scored per run, 0 and the budget in"
    )
    parser.add_argument("--quick", action="store_true", help="a check of the whole path: 40 s runs, 1 seed")
    parser.add_argument("--latency", choices=["both", "off", "on"], default="both")
    parser.add_argument("--latency-model", choices=["pareto", "recorded"], default="pareto")
    parser.add_argument("--latency-sample", default=str(RECORDED), help="the recorded sample (JSON, exec_s)")
    parser.add_argument("--latency-scale-s", type=float, default=0.2)
    parser.add_argument("--latency-alpha", type=float, default=1.5)
    parser.add_argument("--latency-cap-s", type=float, default=10.0)
    parser.add_argument(
        "--sft-from",
        default="",
        help="an SFT export of the same config (runs/NAME/models/sft/v*), copied; default: build",
    )
    parser.add_argument("--config", default=str(RACE_CONFIG))
    parser.add_argument("--sft-into", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(REPO / "runs" / "peer-trl"))
    parser.add_argument("--png", default="", help="default: <out>/peer_trl.png")
    parser.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.sft_into:  # the child of `build_sft`
        return {"sft": str(build_sft_here(load_spec(args.config), Path(args.sft_into)))}
    if args.quick:
        args.budget_s, args.seeds = min(args.budget_s, 40.0), 1

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
        sft_dir = build_sft(base, stacx_home() / "peer-trl", config=args.config)
    sft_s = time.monotonic() - t
    print(f"[peer_trl] SFT checkpoint {sft_dir} ({sft_s:.0f}s)", flush=True)

    runs: list[SideRun] = []
    (cfg.out / "sides.jsonl").unlink(missing_ok=True)
    for latency in {"both": [False, True], "off": [False], "on": [True]}[args.latency]:
        for seed in cfg.seeds:
            for side in ("stacx", "trl"):
                if side == "stacx":
                    runs.append(run_stacx(base, cfg, sft_dir, latency=latency, seed=seed))
                else:
                    runs.append(run_trl(trl_python, cfg, sft_dir, latency=latency, seed=seed))
                with open(cfg.out / "sides.jsonl", "a") as saved:  # what scoring needs, kept if it fails
                    saved.write(json.dumps({**asdict(runs[-1]), "at": time.time()}) + "\n")
                print(
                    f"[peer_trl] {side} latency={latency} seed={seed}: {len(runs[-1].versions) - 1} versions",
                    flush=True,
                )
    t = time.monotonic()
    scorer = Scorer(cfg, sft_dir)
    scorer.score_all(run.version_at(t + 1e-6) for run in runs for t in scorer.times())
    for run in runs:
        run.curve = scorer.curve(run)
    eval_s = time.monotonic() - t
    measured = _curves(scorer, runs)
    png = Path(args.png) if args.png else cfg.out / "peer_trl.png"
    latency_label = (
        "recorded sandbox exec times added to each tool call"
        if cfg.latency.model == "recorded"
        else f"heavy-tailed tool latency (Pareto, scale {cfg.latency.scale_s} s, alpha {cfg.latency.alpha})"
    )
    plot(png, scorer.times(), measured["curves"], num_heldout=cfg.num_heldout, seeds=len(cfg.seeds),
         latency_label=latency_label)

    result: dict[str, Any] = {
        "benchmark": "peer_trl",
        "task": base.pipeline.tasks.source,
        "num_heldout": cfg.num_heldout,
        "seeds": cfg.seeds,
        "budget_s": cfg.budget_s,
        "checkpoints_s": scorer.times(),
        "latency_model": cfg.latency.model,
        "sft_start": {
            "sha256": weights_sha256(sft_dir),
            "success": round(scorer.score(str(sft_dir))["success"], 4),
            "kernels": "given" if args.sft_from else built_kernels(sft_dir),
        },
    }
    for setting, suffix in (("plain", ""), ("latency", "_latency")):
        for key, value in measured["stats"].get(setting, {}).items():
            result[key + suffix] = value
        pair = [r for r in runs if r.latency == (setting == "latency")]
        if pair:
            result["memory_ratio" + suffix] = memory_ratio(pair)
    result.update(
        {
            "memory_ratio": memory_ratio(runs),
            "peak_pss_mib_stacx": round(_peak_pss(runs, "stacx") / 2**20, 1),
            "peak_pss_mib_trl": round(_peak_pss(runs, "trl") / 2**20, 1),
            "curves": measured["curves"],
            "runs": [r.summary() for r in runs],
            "settings": settings_side_by_side(cfg, trl_python, str(base.pipeline.tasks.source)),
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
