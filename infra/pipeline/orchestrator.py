"""The pipeline, end to end on one machine (`stacx run CONFIG`; the quickstart is one config).

    model (a Hugging Face directory, or a tiny one made here) -> tasks (Harbor folder, JSONL,
    topic, or a task-source plug-in) -> [SFT warm start (sft recipe, in process)] -> held-out eval (before)
    -> services: sandbox gateway, inference server (with its weight subscriber), Faust assembler,
       trainer (FSDP2, 2 CPU ranks), rollout service  -- all through the run's Kafka topics,
       supervised (a crashed service is restarted with backoff, within a restart budget)
    -> GRPO until the trainer has published `steps` policy versions (live view, periodic evals)
    -> held-out eval (after) -> report.json + reward-curve PNG

Each service is its own `stacx <service>` process with its config file under
`runs/<name>/config/`, supervised: a crashed service is restarted with backoff until its restart
budget (`pipeline.services.restarts`) is spent, and resumes from its committed offsets and
checkpoints. The weight subscriber lives in the inference server (`stacx serve
--follow-weights`), so a restarted server catches up to the newest version by itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from stacx.infra.config import build, resolve_path
from stacx.infra.pipeline import preflight
from stacx.infra.pipeline.config import PipelineSpec
from stacx.infra.pipeline.errors import PipelineConfigError, PipelineError, ServiceError, StallError
from stacx.infra.pipeline.evaluation import EvalResult, eval_figures, run_evaluation
from stacx.infra.pipeline.layout import (
    RunLayout,
    clear_run_dir,
    gateway_backend,
    gateway_section,
    inference_services,
    placement,
    rollout_section,
    router_section,
    service_urls,
)
from stacx.infra.pipeline.monitor import (
    EvalPoint,
    RunMetrics,
    TopicMonitor,
    assembler_drop_reason,
    assembler_keeps,
)
from stacx.infra.pipeline.placement import visible_devices
from stacx.infra.pipeline.preload import Preloader, model_modules
from stacx.infra.pipeline.report import plot_curve, write_report
from stacx.infra.pipeline.resolve import base_model_dir, plan, transcript_adapter
from stacx.infra.pipeline.services import ServiceProcess, ServiceSpec, Supervisor
from stacx.infra.pipeline.sft import DemonstrationEncoder, demonstration_batches, run_sft, transcript_batches
from stacx.infra.pipeline.stall import Progress, StallWatch, diagnose
from stacx.infra.pipeline.tasks import (
    heldout_rows,
    jsonl_rows,
    publish_tasks,
    source_rows,
    task_order,
    write_tasks,
)
from stacx.infra.pipeline.tracking import SFT_LOSS, TRACKING_DIR, outcome_of, start_tracking
from stacx.infra.pipeline.view import render, status_line
from stacx.infra.tracking import TrackingFeed

__all__ = ["Pipeline", "run_pipeline"]

log = logging.getLogger(__name__)

TOKEN_ENV = "STACX_SANDBOX_TOKEN"
LEARNERS = ("assembler", "trainer", "rollout")
"""The GRPO services, waited for together once the rollout service has started."""
STOP_WAVES = (("rollout",), ("trainer", "assembler", "router"))
"""Stopped first, wave by wave (the rest after them): see `Pipeline._stop_waves`."""
TRAINING = " through Kafka"
"""In the stage line while the recipe trains through the run's topics (`bench/chaos.py` strikes then)."""
MAX_TASK_EVENTS = 65_536
"""Most training-task events one run writes to its tasks topic."""


class Pipeline:
    """One run of the pipeline described by a `PipelineSpec`; see the module docstring."""

    def __init__(self, spec: PipelineSpec, *, layout: RunLayout | None = None) -> None:
        self.spec = spec
        self.cfg = spec.pipeline
        self.layout = layout or RunLayout.create(spec)
        filtering = _assembler_filtering(spec)
        self.metrics = RunMetrics(
            keeps=assembler_keeps(filtering), drop_reason=assembler_drop_reason(filtering)
        )
        self.services: dict[str, ServiceProcess] = {}
        self.supervisor = Supervisor(self.cfg.services.restarts)
        self.task_set = self._task_set()
        self._task_type = ""
        self.heldout_rows: list[dict[str, Any]] = []
        self.timings: dict[str, float] = {}
        self.evals: dict[str, EvalResult] = {}
        self.swaps: list[str] = []
        self._token = os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(24)
        self._eval_pool = concurrent.futures.ThreadPoolExecutor(1, "stacx-eval")
        self._pending_eval: concurrent.futures.Future[EvalResult] | None = None
        self._sft_dir = base_model_dir(spec, self.layout)
        self.tracking: TrackingFeed | None = None
        self.preloader: Preloader | None = None

    def _task_set(self) -> Any:
        """The task-source plug-in of `pipeline.tasks.source` (None for harbor, jsonl, topic)."""
        tasks = self.cfg.tasks
        if tasks.source is None:
            return None
        from stacx.rollout.data import build_task_set
        from stacx.rollout.errors import ConfigError

        try:
            return build_task_set(tasks.source, tasks.options)
        except ConfigError as exc:
            raise PipelineConfigError(f"{self.spec.source}: pipeline.tasks.source: {exc}") from exc

    # ----------------------------------------------------------------------------- urls

    @property
    def inference_url(self) -> str:
        return service_urls(self.spec)[0]

    @property
    def sandbox_owner(self) -> str:
        """Owner label of every sandbox container of this run (the reaper's key)."""
        return f"stacx-{self.layout.run_id}"

    @property
    def gateway_url(self) -> str:
        return service_urls(self.spec)[1]

    # ----------------------------------------------------------------------------- main

    def run(self) -> dict[str, Any]:
        """Run every stage; always stops the services it started. Returns the report."""
        started = time.monotonic()
        preflight.check_all(self.spec)
        self._prepare_run_dir()
        os.environ[TOKEN_ENV] = self._token  # read by the rollout evaluation in this process
        error: BaseException | None = None
        try:
            with self._live() as refresh:
                self._stages(refresh)
        except BaseException as exc:  # the report still says how far the run got, then re-raise
            error = exc
            raise
        finally:
            self._finish_tracking(error)
            self._shutdown()
            report = self._report(time.monotonic() - started, error)
            write_report(self.layout.report_path, report)
            plot_curve(self.layout.curve_path, self.metrics, title=f"STACX {self.layout.run_id}")
        return report

    def _stages(self, refresh: Any) -> None:
        self._timed("setup_s", self._setup)
        self._start_tracking()
        sft_dir = self._timed("sft_s", self._sft)
        self._timed("services_s", self._start_serving, sft_dir)
        if self._evaluates():
            self.evals["before"] = self._timed("eval_before_s", self._evaluate, "before", True)
        self._timed("training_s", self._grpo, refresh)
        self._stop_service("rollout")
        self._await_swap(self.metrics.policy_version)
        if self._evaluates():
            self.evals["after"] = self._timed("eval_after_s", self._evaluate, "after", True)
        refresh()
        self._check_failed_episodes()

    def _check_failed_episodes(self) -> None:
        """PipelineError when more training episodes failed than `pipeline.max_failed_fraction`."""
        failed, total = self.metrics.failed_episodes()
        if total and failed / total > self.cfg.max_failed_fraction:
            reasons = "; ".join(f"{n}x {why}" for why, n in self.metrics.failure_reasons.most_common(3))
            raise PipelineError(
                f"{failed} of {total} training episodes failed ({failed / total:.0%} > "
                f"pipeline.max_failed_fraction={self.cfg.max_failed_fraction:g}): {reasons}"
            )

    def set_up(self) -> Path:
        """The run's topics, model and tasks, then the SFT warm start: the model the services
        start from (`stacx node up` on the host that sets a cluster's run up)."""
        self._setup()
        return Path(self._sft())

    def _evaluates(self) -> bool:
        """Before/after evaluation needs held-out tasks (none for a topic without `heldout`)."""
        return bool(self.heldout_rows) and self.cfg.evaluation.final_samples_per_problem > 0

    def _timed(self, name: str, fn: Any, *args: Any) -> Any:
        t0 = time.monotonic()
        try:
            return fn(*args)
        finally:
            self.timings[name] = round(time.monotonic() - t0, 2)

    # ----------------------------------------------------------------------------- stages

    def _prepare_run_dir(self) -> None:
        # a run name is reused: the new run replaces the old one's files, but not its tracker data
        clear_run_dir(self.layout.root, keep=[TRACKING_DIR])
        for d in (self.layout.config_dir, self.layout.logs_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._file_logging()

    def _file_logging(self) -> None:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per status poll otherwise
        handler = logging.FileHandler(self.layout.logs_dir / "pipeline.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)

    def _setup(self) -> None:
        from stacx.infra.services.topics import ensure_topics

        self.metrics.stage = "creating topics, model and tasks"
        policy = self.spec.topics
        ensure_topics(self.spec.bootstrap_servers, self.layout.topics.specs(policy), policy)
        model = self.cfg.model
        if model.tiny is not None:
            from stacx.rollout.models import make_tiny_model

            make_tiny_model(self.layout.base_model, **model.tiny.model_dump())
        if self.task_set is not None:
            self._generate_tasks()
        else:
            self.heldout_rows = heldout_rows(self.spec)
        if self.heldout_rows:
            write_tasks(self.layout.heldout_tasks, self.heldout_rows)

    def _generate_tasks(self) -> None:
        """The task source's rows: held-out ones (its own, else `tasks.heldout`) and training
        ones, published in shuffled passes to the run's tasks topic."""
        assert self.task_set is not None
        where = f"{self.spec.source}: pipeline.tasks.source"
        own_heldout = getattr(self.task_set, "heldout_tasks", None)
        if callable(own_heldout) and not self.cfg.tasks.heldout:
            self.heldout_rows = source_rows(own_heldout(), where=where)
        else:
            self.heldout_rows = heldout_rows(self.spec)
        train_rows = source_rows(self.task_set.train_tasks(), where=where)
        if not train_rows:
            raise PipelineError(f"{where}: train_tasks() returned no tasks")
        self._task_type = str(train_rows[0]["task_type"])
        write_tasks(self.layout.train_tasks, train_rows)
        seed = int((self.spec.rollout.get("data") or {}).get("seed", 0) or 0)
        order = task_order(train_rows, passes=self._task_passes(len(train_rows)), seed=seed)
        publish_tasks(self.spec.bootstrap_servers, self.layout.topics.tasks, order)

    def _task_passes(self, num_tasks: int) -> int:
        """Passes over the training tasks: four times what `steps` batches need, at least one,
        at most MAX_TASK_EVENTS events in all."""
        groups_per_batch = self._trajectories_per_batch() // max(1, self._group_size())
        needed = min(4 * self.cfg.steps * max(1, groups_per_batch), MAX_TASK_EVENTS)
        return max(1, needed // max(1, num_tasks))

    def _group_size(self) -> int:
        grouping = self.spec.assembler.get("grouping") or {}
        return int(grouping.get("group_size", 1) or 1)

    def _system_prompt(self) -> str:
        evaluators = (self.spec.rollout.get("manager") or {}).get("evaluators") or {}
        options = evaluators.get(self._task_type) or evaluators.get("default") or {}
        scaffold_options = options.get("scaffold_options") or {}
        if "system_prompt" in scaffold_options:
            return str(scaffold_options["system_prompt"])
        from stacx.rollout.scaffolds import RETOOL_SYSTEM

        return RETOOL_SYSTEM

    def _sft(self) -> Path:
        if self.cfg.sft is None:
            return self._sft_dir  # no warm start: the services start from the model as given
        if self.task_set is not None and callable(getattr(self.task_set, "demonstration", None)):
            batches = self._demonstration_batches()
        elif self.cfg.transcripts is not None:
            batches = self._transcript_batches()
        else:
            return self._sft_dir
        self._sft_dir = self._two_phase_sft(batches)
        return self._sft_dir

    def _demonstration_batches(self) -> list[Any]:
        """The task source's demonstrations, rendered like a rollout episode."""
        from stacx.rollout.tokens import HFTokenizer

        assert self.task_set is not None and self.cfg.sft is not None
        tokenizer = HFTokenizer(str(self._sft_dir))
        encoder = DemonstrationEncoder(tokenizer=tokenizer, system_prompt=self._system_prompt())
        end = tokenizer.inner.eos_token or ""
        return demonstration_batches(self.task_set.demonstration, encoder, self.cfg.sft, end_token=end)

    def _transcript_batches(self) -> list[Any]:
        """Scaffold transcripts, rendered as the scaffold's first model call through the proxy."""
        from stacx.rollout.blackbox.transcripts import TranscriptRenderer
        from stacx.rollout.tokens import HFTokenizer

        transcripts, sft = self.cfg.transcripts, self.cfg.sft
        assert transcripts is not None and sft is not None
        renderer = TranscriptRenderer(transcript_adapter(self.spec), HFTokenizer(str(self._sft_dir)).inner)
        rows = jsonl_rows(resolve_path(transcripts.path, self.spec.base_dir))
        return transcript_batches(rows, renderer.encode, sft, transcripts)

    def _two_phase_sft(self, batches: list[Any]) -> Path:
        """The skill steps at the full learning rate, then the final mixture at a lower one."""
        sft = self.cfg.sft
        assert sft is not None
        self.metrics.stage = f"SFT warm start ({sft.steps} steps)"
        skill, mixture = batches[: sft.skill_steps], batches[sft.skill_steps :]

        def progress(offset: int) -> Any:
            def on_step(step: int, loss: float) -> None:
                self.metrics.sft_loss.append((offset + step, round(loss, 5)))
                if self.tracking is not None:  # the warm start's curve, per SFT step
                    self.tracking.log(offset + step, {SFT_LOSS: loss})
                self.metrics.stage = f"SFT warm start: step {offset + step}/{sft.steps} loss {loss:.3f}"

            return on_step

        model = self._sft_dir
        if skill:  # the skill: expert-heavy demonstrations at the full learning rate
            model = run_sft(
                model,
                self.layout.sft_root,
                skill,
                lr=sft.lr,
                warmup_steps=sft.warmup_steps,
                seed=sft.seed,
                export_name="sft-skill",
                on_step=progress(0),
            )
        if mixture:  # the habit: the final mixture at a lower learning rate
            model = run_sft(
                model,
                self.layout.sft_root,
                mixture,
                lr=sft.mixture_lr,
                seed=sft.seed + 1,
                export_name="sft",
                on_step=progress(len(skill)),
            )
        return model

    def _start_serving(self, sft_dir: Path) -> None:
        self.metrics.stage = "starting the sandbox gateway and the inference server(s)"
        self._start_preloader(sft_dir)
        cfg_dir = self.layout.config_dir
        gateway = gateway_section(self.spec, self.layout)
        gateway_file = self._write_yaml(cfg_dir / "gateway.yaml", {"gateway": gateway})
        self._start(
            ServiceSpec(
                name="gateway",
                ready_url=f"{self.gateway_url}/healthz",
                args=["gateway", "--config", str(gateway_file)],
            ),
            wait=False,
        )
        names = ["gateway"]
        assembler, trainer, rollout = self._learner_specs(sft_dir)
        for spec in (assembler, rollout):  # fresh processes: they start while the preloader imports
            self._start(spec, wait=False)
        for server in inference_services(self.spec, self.layout, model_dir=sft_dir):
            path = self._write_yaml(cfg_dir / f"{server.name}.yaml", {"inference": server.section})
            self._start(
                ServiceSpec(
                    name=server.name,
                    ready_url=f"{server.url}{server.ready_path}",
                    args=["serve", "--config", str(path)],
                    env=dict(server.env),
                ),
                wait=False,
            )
            names.append(server.name)
        self._start(trainer, wait=False)  # forked after the server: the first rollouts wait for it
        for name in names:
            self.services[name].wait_ready(self.cfg.services.startup_timeout_s)
        router = router_section(self.spec, self.layout, model_dir=sft_dir)
        if router is not None:  # several servers: one URL in front of them for rollout and evals
            path = self._write_yaml(cfg_dir / "router.yaml", {"router": router})
            # sglang-router's /readiness answers 200 once every server is registered and healthy
            self._start(ServiceSpec(name="router", ready_url=f"{self.inference_url}/readiness",
                                    args=["route", "--config", str(path)]))

    def _grpo(self, refresh: Any) -> None:
        self.metrics.stage = "starting the assembler, the trainer and the rollout service"
        monitor = TopicMonitor(
            self.metrics,
            bootstrap_servers=self.spec.bootstrap_servers,
            trajectories_topic=self.layout.topics.trajectories,
            batches_topic=self.layout.topics.batches,
            weights_topic=self.layout.topics.weights,
            model_name=self.layout.model_name,
        ).start()
        try:
            self._wait_training_services()
            recipe = self.spec.trainer.get("recipe", "grpo")
            self.metrics.stage = f"{recipe}{TRAINING} (target: {self.cfg.steps} policy versions)"
            self._follow(refresh)
        finally:
            monitor.stop()
            if monitor.error:
                log.warning("%s", monitor.error)

    def _learner_specs(self, sft_dir: Path) -> tuple[ServiceSpec, ServiceSpec, ServiceSpec]:
        """The assembler, the trainer and the rollout service, their configs written. They start
        with the gateway and the inference server, not waited for there: the assembler and the
        trainer meet the rest only through the run's topics, whose consumers start from the
        earliest offset, and the rollout service waits for the server's health itself
        (`inference.wait_ready_s`), so their start-up overlaps the server's instead of following it."""
        cfg_dir = self.layout.config_dir
        services = plan(self.spec, self.layout, model_dir=sft_dir)
        rollout_file = self._write_yaml(cfg_dir / "rollout.yaml", services.rollout)
        assembler_file = self._write_yaml(cfg_dir / "assembler.yaml", services.assembler)
        trainer_file = self._write_yaml(cfg_dir / "trainer.yaml", services.trainer)
        env = visible_devices(placement(self.spec)[0].trainer)
        return (
            ServiceSpec(name="assembler", args=["assemble", "--config", str(assembler_file)]),
            ServiceSpec(name="trainer", args=["train", str(trainer_file)], finishes=True, env=env),
            ServiceSpec(name="rollout", args=["rollout", str(rollout_file), "--progress", "false"]),
        )

    def _wait_training_services(self) -> None:
        """The assembler, the trainer and the rollout service (started by `_start_serving`)."""
        for name in LEARNERS:
            self.services[name].wait_ready(self.cfg.services.startup_timeout_s)

    def _follow(self, refresh: Any) -> None:
        """Until the trainer has published the last version: refresh, evaluate, watch services."""
        deadline = time.monotonic() + self.cfg.timeout_s
        watch = StallWatch(timeout_s=self.cfg.stall_timeout_s)
        last_eval_version = 0
        while self.metrics.policy_version < self.cfg.steps:
            if time.monotonic() > deadline:
                raise PipelineError(
                    f"GRPO did not reach {self.cfg.steps} policy versions within "
                    f"pipeline.timeout_s={self.cfg.timeout_s:.0f}s (at version "
                    f"{self.metrics.policy_version}); see the logs in {self.layout.logs_dir}"
                )
            self.supervisor.poll()
            self._check_progress(watch)
            last_eval_version = self._maybe_evaluate(last_eval_version)
            self._poll_server_version()
            refresh()
            time.sleep(1.0)
        self._collect_eval(block=True)

    def _progress(self) -> Progress:
        m = self.metrics
        return Progress(
            trajectories=m.num_trajectories,
            batches=m.num_batches,
            versions=m.policy_version,
            usable=m.num_usable_trajectories,
            dropped=tuple(m.dropped.most_common(3)),
        )

    def _check_progress(self, watch: StallWatch) -> None:
        progress = self._progress()
        stalled_s = watch.observe(progress, time.monotonic())
        if stalled_s < watch.timeout_s:
            return
        raise StallError(
            diagnose(
                progress,
                stalled_s=stalled_s,
                trajectories_per_batch=self._trajectories_per_batch(),
                gateway_problem=self._gateway_problem(),
                logs_dir=self.layout.logs_dir,
                inference_logs=[*self._server_names(), *(n for n in self.services if n == "router")],
            )
        )

    def _trajectories_per_batch(self) -> int:
        grouping = self.spec.assembler.get("grouping") or {}
        mixture = self.spec.assembler.get("mixture") or {}
        size = int(mixture.get("batch_size", 1) or 1)
        per_group = int(grouping.get("group_size", 1) or 1)
        return size * per_group if mixture.get("batch_unit", "groups") == "groups" else size

    def _gateway_problem(self) -> str | None:
        import httpx

        try:
            answer = httpx.get(f"{self.gateway_url}/healthz", timeout=5.0)
        except httpx.HTTPError as exc:
            return f"the sandbox gateway at {self.gateway_url} does not answer /healthz ({exc})"
        if answer.status_code == 503:
            return str(answer.json().get("problem") or answer.text)
        return None

    # ----------------------------------------------------------------------------- evaluation

    def _heldout_tasks(self, full: bool) -> list[Any]:
        from stacx.rollout.data import task_from_dict

        rows = self.heldout_rows if full else self.heldout_rows[: self.cfg.evaluation.num_problems]
        return [task_from_dict(r, where="heldout") for r in rows]

    def _eval_job(self, full: bool) -> EvalResult:
        ev = self.cfg.evaluation
        section = rollout_section(
            self.spec,
            self.layout,
            model_dir=self._model_dir(),
            inference_url=self.inference_url,
            gateway_url=self.gateway_url,
        )
        return run_evaluation(
            section,
            self._heldout_tasks(full),
            heldout_path=str(self.layout.heldout_tasks),
            samples=ev.final_samples_per_problem if full else ev.samples_per_problem,
            version=self._server_version_int(),
            success_reward=self.cfg.tracking.success_reward if self.cfg.tracking else 1.0,
        )

    def _model_dir(self) -> Path:
        return self._sft_dir

    def _evaluate(self, label: str, full: bool) -> EvalResult:
        self.metrics.stage = f"held-out evaluation ({label})"
        result = self._eval_job(full)
        self._record_eval(result)
        return result

    def _record_eval(self, result: EvalResult) -> None:
        self.metrics.evals.append(
            EvalPoint(
                version=result.version,
                success=result.success,
                tool_rate=result.tool_rate,
                num_episodes=result.num_episodes,
                wall_s=round(self.metrics.elapsed(), 1),
            )
        )
        log.info(
            "held-out success %.3f, tool-use %.3f at v%d-v%d (%d episodes, %.1fs)",
            result.success,
            result.tool_rate,
            result.version,
            result.last_version,
            result.num_episodes,
            result.wall_s,
        )
        self._log_eval(result)

    def _log_eval(self, result: EvalResult) -> None:
        """At the oldest version the evaluation used, with the newest beside it (the server may
        swap weights while it runs)."""
        if self.tracking is not None:
            self.tracking.log(result.version, eval_figures(result))

    def _maybe_evaluate(self, last_version: int) -> int:
        every = self.cfg.evaluation.every_versions if self.heldout_rows else 0
        self._collect_eval(block=False)
        version = self._server_version_int()
        if every and self._pending_eval is None and version - last_version >= every:
            self._pending_eval = self._eval_pool.submit(self._eval_job, False)
            return version
        return last_version

    def _collect_eval(self, *, block: bool) -> None:
        future = self._pending_eval
        if future is None or (not block and not future.done()):
            return
        self._pending_eval = None
        try:
            self._record_eval(future.result())
        except Exception as exc:  # a periodic evaluation is informative only: log, go on
            log.warning("periodic evaluation failed: %s: %s", type(exc).__name__, exc)

    # ----------------------------------------------------------------------------- weights

    def _server_version(self) -> str:
        import httpx

        try:
            info = httpx.get(f"{self.inference_url}/get_model_info", timeout=5.0).json()
        except (httpx.HTTPError, ValueError):
            return "?"
        return str(info.get("weight_version"))

    def _server_version_int(self) -> int:
        try:
            return int(self.metrics.server_version)
        except ValueError:
            return 0

    def _poll_server_version(self) -> None:
        version = self._server_version()
        if version != self.metrics.server_version and version != "?":
            self.swaps.append(version)
        if version != "?":
            self.metrics.server_version = version

    def _await_swap(self, version: int, timeout_s: float = 120.0) -> None:
        """Wait until the server reports `version` (the final weights) or a later one (the
        trainer may still step on batches assembled before the rollout stopped)."""
        self.metrics.stage = f"waiting for the server to load v{version}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.supervisor.poll()
            self._poll_server_version()
            if self._server_version_int() >= version:
                return
            time.sleep(0.5)
        raise ServiceError(
            f"the inference server still reports weight_version {self.metrics.server_version} "
            f"{timeout_s:.0f}s after v{version} was published; see "
            f"{', '.join(str(self.layout.logs_dir / f'{n}.log') for n in self._server_names())} "
            "(server and weight subscriber)"
        )

    def _server_names(self) -> list[str]:
        """The run's inference services (`inference`, or `inference-0`, `inference-1`, ...)."""
        names = [n for n in self.services if n == "inference" or n.startswith("inference-")]
        return names or ["inference"]

    # ----------------------------------------------------------------------------- trackers

    def _start_tracking(self) -> None:
        self.metrics.stage = "opening the trackers"
        self.tracking = start_tracking(
            self.spec,
            self.layout,
            keeps=self.metrics.keeps,
            inference_url=self.inference_url,
            gateway_url=self.gateway_url,
            token=self._token,
            service_pids=self._service_pids,
        )

    def _service_pids(self) -> dict[str, int]:
        """The services running now, by name (memory per service in the trackers)."""
        pids = {name: service.pid for name, service in list(self.services.items())}
        return {name: pid for name, pid in pids.items() if pid is not None}

    def _finish_tracking(self, error: BaseException | None) -> None:
        """A finished run's trackers get every figure of its topics; an interrupted one's what was
        read; each tracker marks the run finished, failed or killed (Ctrl-C, SIGTERM)."""
        if self.tracking is not None:
            outcome = outcome_of(error)
            self.tracking.finish(drain=outcome != "killed", outcome=outcome)

    def _tracking_locations(self) -> dict[str, str]:
        """Each tracker's folder (for the report)."""
        locations = {} if self.tracking is None else self.tracking.trackers.locations
        return {name: str(path) for name, path in locations.items()}

    # ----------------------------------------------------------------------------- services

    def _run_env(self) -> dict[str, str]:
        # the run id in every process's environment finds the run's processes
        return {TOKEN_ENV: self._token, "STACX_RUN_ID": self.layout.run_id}

    def _start_preloader(self, model_dir: Path) -> None:
        """The process the torch-importing services are forked from (`pipeline.services.preload`),
        with the modeling code of the run's model; its imports run while the gateway starts."""
        if not self.cfg.services.preload or self.preloader is not None:
            return
        self.preloader = Preloader({**os.environ, **self._run_env()}, self.layout.logs_dir / "preload.log",
                                   optional=model_modules(model_dir))
        self.preloader.start()

    def process_roots(self) -> dict[str, int]:
        """The run's top processes by name: its services and the preloader."""
        roots = {name: s.pid for name, s in self.services.items() if s.pid is not None}
        if self.preloader is not None and self.preloader.pid is not None:
            roots["preload"] = self.preloader.pid
        return roots

    def _start(self, spec: ServiceSpec, *, wait: bool = True) -> ServiceProcess:
        for name, value in self._run_env().items():
            spec.env.setdefault(name, value)
        if self.cfg.tracing is not None:  # one section turns tracing on (or off) everywhere
            for name, value in self.cfg.tracing.to_env(len(self.services)).items():
                spec.env.setdefault(name, value)
        service = ServiceProcess(spec, self.layout.logs_dir, launcher=self.preloader).start()
        self.services[spec.name] = service
        self.supervisor.add(service)
        if wait:
            service.wait_ready(self.cfg.services.startup_timeout_s)
        return service

    def _stop_service(self, name: str) -> None:
        service = self.services.get(name)
        if service is not None:
            self.supervisor.remove(name)  # a deliberate stop is not a crash
            self.metrics.stage = f"stopping {name}"
            service.stop()

    def _stop_waves(self) -> list[list[str]]:
        """The order of a shutdown: the rollout service (no new requests), then what consumes
        its output and the router, then the rest (servers, gateway) in reverse start order."""
        waves = [[n for n in wave if n in self.services] for wave in STOP_WAVES]
        waves.append([n for n in reversed(self.services) if not any(n in wave for wave in STOP_WAVES)])
        return [wave for wave in waves if wave]

    def _shutdown(self) -> None:
        self._eval_pool.shutdown(wait=False, cancel_futures=True)
        for wave in self._stop_waves():  # the services of a wave stop together, the waves in turn
            with concurrent.futures.ThreadPoolExecutor(len(wave), "stacx-stop") as pool:
                stops = {name: pool.submit(self._stop_service, name) for name in wave}
            for name, stop in stops.items():
                if stop.exception() is not None:
                    log.warning("stopping %s: %s", name, stop.exception())
        with contextlib.suppress(Exception):
            self._reap_sandboxes()
        if self.preloader is not None:
            with contextlib.suppress(Exception):
                self.preloader.close()

    def _reap_sandboxes(self) -> None:
        """Remove containers of this run that the gateway left behind (it was killed, or the
        engine was wedged when it closed its sessions): by owner label, nothing else."""
        if "gateway" not in self.services or gateway_backend(self.spec) != "docker":
            return
        from stacx.sandbox.backends import DockerBackend

        async def reap() -> int:
            backend = DockerBackend()
            try:
                return await backend.reap(owner=self.sandbox_owner, keep=set())
            finally:
                await backend.close()

        removed = asyncio.run(reap())
        if removed:
            log.warning("removed %d sandbox container(s) the gateway left behind", removed)

    @staticmethod
    def _write_yaml(path: Path, data: dict[str, Any]) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    # ----------------------------------------------------------------------------- view

    @contextlib.contextmanager
    def _live(self) -> Iterator[Any]:
        title = f"STACX · {self.layout.run_id}"
        if self.cfg.live and sys.stdout.isatty():
            from rich.live import Live

            with Live(
                render(self.metrics, title=title, target_steps=self.cfg.steps), refresh_per_second=2
            ) as live:

                def refresh() -> None:
                    live.update(render(self.metrics, title=title, target_steps=self.cfg.steps))

                stop = threading.Event()
                ticker = threading.Thread(target=self._tick, args=(refresh, stop), daemon=True)
                ticker.start()
                try:
                    yield refresh
                finally:
                    stop.set()
                    refresh()
            return
        last = {"t": 0.0}
        lock = threading.Lock()

        def log_refresh() -> None:
            with lock:  # the ticker and the GRPO loop both call it
                if time.monotonic() - last["t"] < 15.0:
                    return
                last["t"] = time.monotonic()
            log.info("%s", status_line(self.metrics, target_steps=self.cfg.steps))

        stop = threading.Event()  # a line every 15 s in every stage (the SFT warm start too)
        ticker = threading.Thread(target=self._tick, args=(log_refresh, stop), daemon=True)
        ticker.start()
        try:
            yield log_refresh
        finally:
            stop.set()

    @staticmethod
    def _tick(refresh: Any, stop: threading.Event) -> None:
        while not stop.wait(0.5):
            refresh()

    # ----------------------------------------------------------------------------- report

    def _failure_figures(self) -> dict[str, Any]:
        failed, total = self.metrics.failed_episodes()
        return {
            "failed_episodes": failed,
            "failed_fraction": round(failed / total, 4) if total else 0.0,
            "max_failed_fraction": self.cfg.max_failed_fraction,
            "failure_reasons": dict(self.metrics.failure_reasons.most_common(5)),
        }

    def _report(self, wall_s: float, error: BaseException | None = None) -> dict[str, Any]:
        before, after = self.evals.get("before"), self.evals.get("after")
        return {
            "name": self.layout.name,
            "status": "ok" if error is None else "failed",
            "error": None if error is None else f"{type(error).__name__}: {error}",
            "stage": self.metrics.stage,
            "run_id": self.layout.run_id,
            "success_before": None if before is None else round(before.success, 4),
            "success_after": None if after is None else round(after.success, 4),
            "tool_rate_before": None if before is None else round(before.tool_rate, 4),
            "tool_rate_after": None if after is None else round(after.tool_rate, 4),
            "heldout_episodes": None if after is None else after.num_episodes,
            "policy_versions": self.metrics.policy_version,
            "target_policy_versions": self.cfg.steps,
            "server_weight_versions_seen": self.swaps,
            "wall_s": round(wall_s, 1),
            "timings_s": self.timings,
            "num_trajectories": self.metrics.num_trajectories,
            **self._failure_figures(),
            "num_batches": self.metrics.num_batches,
            "reward_curve": self.metrics.reward_curve(),
            "traces_by_version": {
                str(v): s.trace_id for v, s in sorted(self.metrics.by_version.items()) if s.trace_id
            },
            "heldout_curve": [asdict(e) for e in self.metrics.evals],
            "sft_loss": self.metrics.sft_loss[:: max(1, len(self.metrics.sft_loss) // 50)],
            "topics": asdict(self.layout.topics),
            "model_name": self.layout.model_name,
            "config": self.spec.source,
            "curve_png": str(self.layout.curve_path),
            "logs": str(self.layout.logs_dir),
            "tracking": self._tracking_locations(),
        }


def _assembler_filtering(spec: PipelineSpec) -> Any:
    """The assembler's `filtering` section (what decides which trajectories make batches)."""
    from stacx.consumers.assembly import SampleFilter

    return build(SampleFilter.Config, spec.assembler.get("filtering") or {}, where="assembler.filtering")


def run_pipeline(spec: PipelineSpec) -> dict[str, Any]:
    """Run the pipeline; returns the report (also written to runs/<name>/report.json). With a
    `placement: {kind: ray}` section, Ray places the services (stacx.infra.pipeline.rayrun)."""
    if spec.placement is not None:
        from stacx.infra.pipeline.rayrun import RayPipeline

        return RayPipeline(spec).run()
    return Pipeline(spec).run()
