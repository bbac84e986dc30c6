"""Continuous-batching generation engine over a Hugging Face causal LM with a KV cache.

One background thread runs the scheduler loop: apply a pending weight swap when the batch has
drained, admit waiting requests (one left-padded prefill for all of them, then their cache rows
join the running batch), run one decode step for every running row, retire finished rows.
Requests never wait behind a global lock: a request that arrives mid-generation joins the batch
at the next step boundary.

Weight swaps are atomic between decode steps and never mix versions inside one response: while a
swap is pending no new request is admitted, running rows finish (or are aborted when the swap asks
for it), then the parameters are replaced by pointer swap and admission resumes.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from rollout.inference import batch_cache
from rollout.inference.errors import EngineStoppedError, OverloadedError
from rollout.inference.metrics import Metrics
from rollout.inference.sampling import SamplingParams, sample_tokens

__all__ = ["BatchingEngine", "GenerationOutput"]

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class GenerationOutput:
    """What one request produced, and with which weights."""

    output_ids: list[int]
    logprobs: list[float]
    """Logprob of each output token (see `sampling` for the distribution)."""
    text: str
    finish_reason: dict[str, Any]
    """SGLang form: {"type": "stop", "matched": id | str}, {"type": "length", "length": n} or
    {"type": "abort", "message": ...}."""
    weight_version: str
    prompt_tokens: int


@dataclass(slots=True)
class _Job:
    input_ids: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    future: concurrent.futures.Future[GenerationOutput]
    arrived_s: float
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: dict[str, Any] | None = None


@dataclass(slots=True)
class _Swap:
    update: dict[str, torch.Tensor]
    version: str
    abort_running: bool
    future: concurrent.futures.Future[int]


@dataclass(slots=True)
class _Batch:
    """The running rows: job i owns cache row i."""

    jobs: list[_Job]
    cache: Any
    mask: torch.Tensor  # [B, T] 1 on real tokens
    tokens: torch.Tensor  # [B] last sampled token, fed at the next step
    positions: torch.Tensor  # [B] position id of `tokens`


class BatchingEngine:
    """Serves `submit()`ted requests from one model in a background scheduler thread."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        max_batch_size: int = 64
        """Most rows decoded together."""
        max_waiting_requests: int = 4096
        """Queue bound; beyond it `submit` raises `OverloadedError` (HTTP 429)."""
        batch_window_ms: float = 2.0
        """When idle, wait this long after the first arrival for companions to prefill with."""
        seed: int = 0
        """Seed of the sampling RNG."""
        raw_logprobs: bool = False
        """Report logprobs of the unscaled distribution (T = 1) instead of the sampled one."""

    def __init__(
        self,
        config: Config,
        model: Any,
        tokenizer: Any,
        weight_version: str = "default",
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.metrics = metrics or Metrics()
        self.device = next(model.parameters()).device
        self._version = weight_version
        self._eos_ids = _eos_ids(model, tokenizer)
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self._keep_last_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._cond = threading.Condition()
        self._waiting: deque[_Job] = deque()
        self._swap: _Swap | None = None
        self._batch: _Batch | None = None
        self._row_params: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._torch_threads = torch.get_num_threads()  # OpenMP settings are per thread

    # -- public API (any thread) --------------------------------------------------------------

    @property
    def weight_version(self) -> str:
        return self._version

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="stacx-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._fail_all(EngineStoppedError("the inference engine stopped"))

    def submit(
        self, input_ids: list[int], params: SamplingParams
    ) -> concurrent.futures.Future[GenerationOutput]:
        """Queue one request; the future resolves when it finishes."""
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self._eos_ids)
        job = _Job(
            input_ids=list(input_ids),
            params=params,
            stop_ids=stop_ids,
            future=concurrent.futures.Future(),
            arrived_s=time.monotonic(),
        )
        with self._cond:
            if self._stopping:
                raise EngineStoppedError("the inference engine is stopping")
            if len(self._waiting) >= self.config.max_waiting_requests:
                raise OverloadedError(
                    f"{len(self._waiting)} requests are waiting (max_waiting_requests="
                    f"{self.config.max_waiting_requests}); retry later"
                )
            self._waiting.append(job)
            self.metrics.set("waiting_requests", len(self._waiting))
            self._cond.notify_all()
        self.metrics.inc("requests_total")
        self.metrics.inc("prompt_tokens_total", len(input_ids))
        return job.future

    def update_weights(
        self, update: dict[str, torch.Tensor], version: str, abort_running: bool = False
    ) -> concurrent.futures.Future[int]:
        """Swap in `update` (from `weight_files.check_state_dict`) between decode steps.

        Resolves to the number of running requests that were aborted (0 unless `abort_running`).
        """
        swap = _Swap(
            update=update, version=version, abort_running=abort_running, future=concurrent.futures.Future()
        )
        with self._cond:
            if self._swap is not None:
                swap.future.set_exception(OverloadedError("another weight update is pending"))
                return swap.future
            self._swap = swap
            self._cond.notify_all()
        return swap.future

    # -- scheduler loop (engine thread) ---------------------------------------------------------

    def _run(self) -> None:
        torch.set_num_threads(self._torch_threads)
        while not self._stopping:
            try:
                self._step()
            except Exception as exc:  # a failed forward must not kill the server
                log.exception("engine step failed; failing the running requests")
                self._fail_running(exc)

    @torch.inference_mode()
    def _step(self) -> None:
        self._maybe_swap()
        admitted = self._take_waiting()
        if admitted:
            self._admit(admitted)
        if self._batch is not None:
            self._decode()
        elif not admitted:
            self._wait_for_work()

    def _wait_for_work(self) -> None:
        with self._cond:
            while not (self._waiting or self._swap or self._stopping):
                self._cond.wait()
        if self._waiting and self.config.batch_window_ms > 0:
            time.sleep(self.config.batch_window_ms / 1000)

    def _take_waiting(self) -> list[_Job]:
        with self._cond:
            if self._swap is not None or not self._waiting:
                return []
            if self._batch is not None and not batch_cache.is_row_editable(self._batch.cache):
                return []  # this model's cache cannot take rows mid-flight: run cohorts
            running = len(self._batch.jobs) if self._batch is not None else 0
            room = max(self.config.max_batch_size - running, 0)
            jobs = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
            self.metrics.set("waiting_requests", len(self._waiting))
        return jobs

    def _admit(self, jobs: list[_Job]) -> None:
        from transformers import DynamicCache

        ids, mask = self._left_pad(jobs)
        cache = DynamicCache(config=self.model.config)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # [n, L]
        extra = {"logits_to_keep": 1} if self._keep_last_logits else {}
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            **extra,
        )
        self.metrics.inc("prefill_batches_total")
        tokens, logprobs = self._sample(out.logits[:, -1, :], _row_params(jobs, self.device))
        prefilled = _Batch(
            jobs=jobs, cache=out.past_key_values, mask=mask, tokens=tokens, positions=mask.sum(dim=1)
        )
        new = self._retire(prefilled, tokens, logprobs)
        if new is not None:
            self._batch = new if self._batch is None else _join(self._batch, new)
            self._row_params = None
        self.metrics.set("running_requests", len(self._batch.jobs) if self._batch else 0)

    def _left_pad(self, jobs: list[_Job]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts right-aligned in one [n, L] id tensor, and their [n, L] attention mask."""
        length = max(len(job.input_ids) for job in jobs)
        ids = torch.full((len(jobs), length), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(jobs), length), dtype=torch.long)
        for row, job in enumerate(jobs):
            ids[row, length - len(job.input_ids) :] = torch.tensor(job.input_ids)
            mask[row, length - len(job.input_ids) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _decode(self) -> None:
        batch = self._batch
        assert batch is not None
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.jobs), 1))], dim=1)
        out = self.model(
            input_ids=batch.tokens.unsqueeze(1),
            attention_mask=batch.mask,
            position_ids=batch.positions.unsqueeze(1),
            past_key_values=batch.cache,
            use_cache=True,
        )
        self.metrics.observe_batch(len(batch.jobs))
        batch.cache = out.past_key_values
        batch.positions = batch.positions + 1
        if self._row_params is None:
            self._row_params = _row_params(batch.jobs, self.device)
        tokens, logprobs = self._sample(out.logits[:, -1, :], self._row_params)
        batch.tokens = tokens
        self._batch = self._retire(batch, tokens, logprobs)
        if self._batch is not batch:
            self._row_params = None  # rows left: rebuild per-row sampling tensors
        self.metrics.set("running_requests", len(self._batch.jobs) if self._batch else 0)

    def _sample(
        self, logits: torch.Tensor, params: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        temperature, top_k, top_p = params
        return sample_tokens(logits, temperature, top_k, top_p, self._generator, raw=self.config.raw_logprobs)

    def _retire(self, batch: _Batch, tokens: torch.Tensor, logprobs: torch.Tensor) -> _Batch | None:
        """Record this step's tokens; finish and drop the rows that are done."""
        keep: list[int] = []
        for row, (job, token, logprob) in enumerate(
            zip(batch.jobs, tokens.tolist(), logprobs.tolist(), strict=True)
        ):
            job.output_ids.append(token)
            job.logprobs.append(logprob)
            job.finish = self._finish_reason(job, token)
            if job.finish is None:
                keep.append(row)
            else:
                self._complete(job)
        self.metrics.inc("generated_tokens_total", len(batch.jobs))
        if len(keep) == len(batch.jobs):
            return batch
        if not keep:
            return None
        index = torch.tensor(keep, device=self.device)
        cache, mask = batch_cache.select_rows(batch.cache, batch.mask, index)
        cache, mask = batch_cache.trim_left(cache, mask)
        return _Batch(
            jobs=[batch.jobs[i] for i in keep],
            cache=cache,
            mask=mask,
            tokens=batch.tokens[index],
            positions=batch.positions[index],
        )

    def _finish_reason(self, job: _Job, token: int) -> dict[str, Any] | None:
        if token in job.stop_ids:
            return {"type": "stop", "matched": token}
        if job.params.stop:
            text = self.tokenizer.decode(job.output_ids, skip_special_tokens=False)
            for stop in job.params.stop:
                if stop in text:
                    return {"type": "stop", "matched": stop}
        if len(job.output_ids) >= job.params.max_new_tokens:
            return {"type": "length", "length": job.params.max_new_tokens}
        return None

    def _complete(self, job: _Job) -> None:
        assert job.finish is not None
        text = self.tokenizer.decode(job.output_ids, skip_special_tokens=job.params.skip_special_tokens)
        matched = job.finish.get("matched")
        if isinstance(matched, str) and matched in text:
            text = text[: text.index(matched)]
        self.metrics.observe_latency(time.monotonic() - job.arrived_s)
        if not job.future.done():
            job.future.set_result(
                GenerationOutput(
                    output_ids=job.output_ids,
                    logprobs=job.logprobs,
                    text=text,
                    finish_reason=job.finish,
                    weight_version=self._version,
                    prompt_tokens=len(job.input_ids),
                )
            )

    # -- weight swap ---------------------------------------------------------------------------

    def _maybe_swap(self) -> None:
        swap = self._swap
        if swap is None:
            return
        if self._batch is not None and not swap.abort_running:
            return  # drain first: no response mixes two weight versions
        aborted = self._abort_running("weights are being updated") if self._batch else 0
        for name, tensor in swap.update.items():
            self.model.get_parameter(name).data = tensor
        self._version = swap.version
        with self._cond:
            self._swap = None
        self.metrics.inc("weight_updates_total")
        log.info("weights updated to version %s (%d running requests aborted)", swap.version, aborted)
        swap.future.set_result(aborted)

    def _abort_running(self, message: str) -> int:
        jobs = self._batch.jobs if self._batch else []
        for job in jobs:
            job.finish = {"type": "abort", "message": message}
            self._complete(job)
        self._batch = None
        self._row_params = None
        return len(jobs)

    def _fail_running(self, exc: Exception) -> None:
        for job in self._batch.jobs if self._batch else []:
            if not job.future.done():
                job.future.set_exception(exc)
            self.metrics.inc("requests_failed_total")
        self._batch = None
        self._row_params = None

    def _fail_all(self, exc: Exception) -> None:
        self._fail_running(exc)
        with self._cond:
            waiting, self._waiting = list(self._waiting), deque()
            swap, self._swap = self._swap, None
        for job in waiting:
            job.future.set_exception(exc)
        if swap is not None and not swap.future.done():
            swap.future.set_exception(exc)


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def _row_params(jobs: list[_Job], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    temperature = torch.tensor([j.params.temperature for j in jobs], dtype=torch.float32)
    top_k = torch.tensor([j.params.top_k for j in jobs], dtype=torch.long)
    top_p = torch.tensor([j.params.top_p for j in jobs], dtype=torch.float32)
    return temperature.to(device), top_k.to(device), top_p.to(device)


def _join(old: _Batch, new: _Batch) -> _Batch:
    cache, mask = batch_cache.concat_rows(old.cache, old.mask, new.cache, new.mask)
    return _Batch(
        jobs=old.jobs + new.jobs,
        cache=cache,
        mask=mask,
        tokens=torch.cat([old.tokens, new.tokens]),
        positions=torch.cat([old.positions, new.positions]),
    )
