"""Continuous-batching generation engine over a Hugging Face causal LM with a KV cache.

One background thread runs the scheduler loop: apply a pending weight swap when the batch has
drained, admit waiting requests (one prefill for all of them: identical prompts share a row and
cached prefixes are skipped, see `prefill`), run one decode step for every running row, retire
finished rows. A request that arrives mid-generation joins the batch at the next step boundary.

Isolation: a failure while serving one request fails that request alone. A prefill or decode
forward that raises is retried row by row (after undoing what it appended to the cache), so only
the rows that fail on their own are failed; a row whose logits cannot be sampled (NaN, inf) fails
alone; an error while recording a row's token fails that row. Each failure counts in
`requests_failed_total`. Whatever escapes fails the requests then in flight, never leaves one
waiting, and the loop goes on; when the loop ends every unfinished request is failed.

Weight swaps are atomic between decode steps and never mix versions inside one response: while a
swap is pending no new request is admitted, running rows finish (or are aborted when the swap asks
for it), then the parameters are replaced by pointer swap, the prefix cache is flushed and
admission resumes.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from stacx.rollout.inference import batch_cache, prefill
from stacx.rollout.inference.errors import (
    EngineStoppedError,
    InvalidRequestError,
    OverloadedError,
    RequestFailedError,
)
from stacx.rollout.inference.grammar import GrammarCompiler
from stacx.rollout.inference.job import GenerationOutput, Job, RequestOptions
from stacx.rollout.inference.metrics import Metrics
from stacx.rollout.inference.prefix_cache import PrefixCache
from stacx.rollout.inference.sampling import RowSampling, SampleResult, SamplingParams, sample_tokens

__all__ = ["BatchingEngine", "GenerationOutput", "RequestOptions"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Swap:
    update: dict[str, torch.Tensor]
    version: str
    abort_running: bool
    future: concurrent.futures.Future[int]


@dataclass(slots=True)
class _Batch:
    """The running rows: job i owns cache row i."""

    jobs: list[Job]
    cache: Any
    mask: torch.Tensor  # [B, T] 1 on real tokens
    tokens: torch.Tensor  # [B] last sampled token, fed at the next step
    positions: torch.Tensor  # [B] position id of `tokens`
    rows: RowSampling | None = None
    """Per-row sampling tensors; None after the composition changed."""


class BatchingEngine:
    """Serves `submit()`ted requests from one model in a background scheduler thread."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        max_batch_size: int = 64
        """Most rows decoded together."""
        max_waiting_requests: int = 4096
        """Queue bound; beyond it `submit` raises `OverloadedError` (HTTP 429)."""
        batch_window_ms: float = 2.0
        """When idle, wait until no request arrived for this long before prefilling ..."""
        max_batch_window_ms: float = 20.0
        """... but never longer than this after the first arrival."""
        seed: int = 0
        """Seed of the shared sampling RNG (requests with `sampling_seed` use their own)."""
        raw_logprobs: bool = False
        """Report logprobs of the unscaled distribution (T = 1) instead of the sampled one."""
        prefix_cache_tokens: int = 65536
        """Tokens of KV the prefix cache keeps (LRU); 0 turns prefix sharing off."""
        cache_outputs: bool = True
        """Also cache prompt + output when a request ends, for the next turn of a conversation."""

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
        self.vocab_size = int(model.config.vocab_size)
        self._version = weight_version
        self._eos_ids = _eos_ids(model, tokenizer)
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self._keep_last_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._row_editable = batch_cache.is_row_editable(self._empty_cache())
        self.prefix_cache = (
            PrefixCache(config.prefix_cache_tokens)
            if config.prefix_cache_tokens > 0 and self._row_editable
            else None
        )
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._live: dict[str, Job] = {}
        self._in_flight: list[Job] = []
        self._swap: _Swap | None = None
        self._flush_requested = False
        self._batch: _Batch | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._torch_threads = torch.get_num_threads()  # OpenMP settings are per thread
        self._grammars = GrammarCompiler(tokenizer)

    # -- public API (any thread) --------------------------------------------------------------

    @property
    def weight_version(self) -> str:
        return self._version

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="stacx-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the loop and fail every unfinished request; returns within about `timeout_s`."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout_s)
            if self._thread.is_alive():
                log.error("the engine thread did not stop in %.0f s; failing its requests anyway", timeout_s)
        self._fail_all(EngineStoppedError("the inference engine stopped"))

    def submit(
        self, input_ids: list[int], params: SamplingParams, options: RequestOptions | None = None
    ) -> concurrent.futures.Future[GenerationOutput]:
        """Queue one request; the future resolves when it finishes."""
        options = options or RequestOptions()
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self._eos_ids)
        job = Job(list(input_ids), params, options, stop_ids)
        if params.regex is not None or params.json_schema is not None:
            job.guide = self._grammars.guide(
                regex=params.regex, json_schema=params.json_schema, stop_ids=stop_ids
            )
        with self._cond:
            if self._stopping or (self._thread is not None and not self._thread.is_alive()):
                raise EngineStoppedError("the inference engine is stopping")
            if len(self._waiting) >= self.config.max_waiting_requests:
                raise OverloadedError(
                    f"{len(self._waiting)} requests are waiting (max_waiting_requests="
                    f"{self.config.max_waiting_requests}); retry later"
                )
            if options.rid is not None:
                if options.rid in self._live:
                    raise InvalidRequestError("rid", f"{options.rid!r} is already running; use a new id")
                self._live[options.rid] = job
            self._waiting.append(job)
            self.metrics.set("waiting_requests", len(self._waiting))
            self._cond.notify_all()
        job.future.add_done_callback(lambda _: self._forget(job))
        self.metrics.inc("requests_total")
        self.metrics.inc("prompt_tokens_total", len(input_ids))
        return job.future

    def abort(self, rid: str | None = None, abort_all: bool = False, message: str = "aborted") -> int:
        """End the request `rid`, or with `abort_all` every unfinished request (with or without
        a client rid: OpenAI routes set none): waiting ones at once, running ones at the next step.

        They finish with `finish_reason` {"type": "abort"}; returns how many were found.
        """
        with self._cond:
            if abort_all:
                jobs = _unique([*self._waiting, *self._in_flight, *self._running()])
            else:
                jobs = [j for j in [self._live.get(rid or "")] if j is not None]
            jobs = [j for j in jobs if not j.done]
            waiting = [j for j in jobs if j in self._waiting]
            for job in waiting:
                self._waiting.remove(job)
        for job in jobs:
            job.abort(message)
        for job in waiting:
            job.finish = {"type": "abort", "message": message}
            self._complete(job)
        self.metrics.inc("requests_aborted_total", len(jobs))
        return len(jobs)

    def abort_job(self, future: concurrent.futures.Future[GenerationOutput], message: str) -> None:
        """Abort the request behind `future` (a client that went away)."""
        with self._cond:
            job = next((j for j in [*self._waiting, *self._running()] if j.future is future), None)
            if job is not None and job in self._waiting:
                self._waiting.remove(job)
                job.finish = {"type": "abort", "message": message}
            elif job is not None:
                job.abort(message)
        if job is None:
            return
        self.metrics.inc("requests_aborted_total")
        if job.finish is not None:
            self._complete(job)

    def flush_cache(self) -> None:
        """Empty the prefix cache at the next step boundary."""
        with self._cond:
            self._flush_requested = True
            self._cond.notify_all()

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

    def _running(self) -> list[Job]:
        batch = self._batch
        return list(batch.jobs) if batch is not None else []

    def _forget(self, job: Job) -> None:
        if job.rid is not None:
            with self._cond:
                if self._live.get(job.rid) is job:
                    del self._live[job.rid]

    # -- scheduler loop (engine thread) ---------------------------------------------------------

    def _run(self) -> None:
        torch.set_num_threads(self._torch_threads)
        try:
            while not self._stopping:
                try:
                    self._step()
                except Exception as exc:  # a bug or a model-wide failure: never leave anyone hanging
                    log.exception("engine step failed; failing the requests in flight")
                    self._fail_in_flight(exc)
        finally:
            self._fail_all(EngineStoppedError("the inference engine stopped"))

    @torch.inference_mode()
    def _step(self) -> None:
        self._maybe_flush()
        self._maybe_swap()
        admitted = self._take_waiting()
        if admitted:
            self._in_flight = admitted
            self._admit(admitted)
            self._in_flight = []
        if self._batch is not None:
            self._decode()
        elif not admitted:
            self._wait_for_work()

    def _wait_for_work(self) -> None:
        with self._cond:
            while not (self._waiting or self._swap or self._stopping or self._flush_requested):
                self._cond.wait()
        self._gather_companions()

    def _gather_companions(self) -> None:
        """Wait until arrivals pause (a burst of requests prefills together), within a bound."""
        window = self.config.batch_window_ms / 1000
        if window <= 0:
            return
        deadline = time.monotonic() + self.config.max_batch_window_ms / 1000
        seen = -1
        while not self._stopping and len(self._waiting) != seen and time.monotonic() < deadline:
            seen = len(self._waiting)
            if seen >= self.config.max_batch_size:
                return
            time.sleep(window)

    def _take_waiting(self) -> list[Job]:
        with self._cond:
            if self._swap is not None or not self._waiting:
                return []
            if self._batch is not None and not self._row_editable:
                return []  # this model's cache cannot take rows mid-flight: run cohorts
            running = len(self._batch.jobs) if self._batch is not None else 0
            room = max(self.config.max_batch_size - running, 0)
            jobs = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
            self.metrics.set("waiting_requests", len(self._waiting))
        return jobs

    # -- prefill --------------------------------------------------------------------------------

    def _admit(self, jobs: list[Job]) -> None:
        """Prefill `jobs` together; if that raises, alone, so only the culprits fail."""
        try:
            new = self._prefill(jobs)
        except Exception as exc:
            if len(jobs) == 1:
                self._fail(jobs[0], exc, "prefill")
                return
            log.warning("batched prefill of %d requests failed (%r); retrying one by one", len(jobs), exc)
            for job in jobs:
                self._admit([job])
            return
        if new is not None:
            self._batch = new if self._batch is None else _join(self._batch, new)
        self.metrics.set("running_requests", len(self._batch.jobs) if self._batch else 0)

    def _prefill(self, jobs: list[Job]) -> _Batch | None:
        rows = prefill.group_rows(jobs, self.prefix_cache)
        inputs = prefill.build_inputs(rows, self._pad_id, self.device, self._empty_cache())
        keep_all = any(row.logprob_start is not None for row in rows)
        extra = {"logits_to_keep": 1} if self._keep_last_logits and not keep_all else {}
        out = self.model(
            input_ids=inputs.input_ids,
            attention_mask=inputs.mask,
            position_ids=inputs.positions,
            past_key_values=inputs.cache,
            use_cache=True,
            **extra,
        )
        self.metrics.inc("prefill_batches_total")
        cache = out.past_key_values
        self._cache_prompts(rows, cache, inputs.mask.shape[1], inputs.suffix_lengths)
        self._count_cache_hits(rows)
        for u, row in enumerate(rows):
            if row.logprob_start is not None:
                self._record_prompt_logprobs(row, out.logits[u])
        generating = [(u, job) for u, row in enumerate(rows) for job in row.jobs if self._generates(job)]
        if not generating:
            return None
        index = torch.tensor([u for u, _ in generating], device=self.device)
        gen_jobs = [job for _, job in generating]
        if len(gen_jobs) != len(rows) or any(u != i for i, (u, _) in enumerate(generating)):
            cache, mask = batch_cache.select_rows(cache, inputs.mask, index)
        else:
            mask = inputs.mask
        lengths = torch.tensor([len(job.input_ids) for job in gen_jobs], device=self.device)
        batch = _Batch(jobs=gen_jobs, cache=cache, mask=mask, tokens=lengths, positions=lengths)
        batch.rows = self._row_sampling(gen_jobs)
        result = self._sample(out.logits[:, -1, :].index_select(0, index), batch.rows)
        batch.tokens = result.tokens
        return self._retire(batch, result)

    def _generates(self, job: Job) -> bool:
        """False (and the job completes now) for `max_new_tokens` 0: prompt logprobs only."""
        if job.params.max_new_tokens > 0:
            return True
        job.finish = {"type": "length", "length": 0}
        self._complete(job)
        return False

    def _cache_prompts(
        self, rows: list[prefill.PrefillRow], cache: Any, width: int, suffixes: list[int]
    ) -> None:
        if self.prefix_cache is None:
            return
        for u, (row, suffix) in enumerate(zip(rows, suffixes, strict=True)):
            columns = torch.arange(width - suffix, width, device=self.device)
            self.prefix_cache.insert(row.ids, batch_cache.row_kv(cache, columns, u), row.cached)
        self.metrics.set("prefix_cache_tokens", self.prefix_cache.num_tokens)

    def _count_cache_hits(self, rows: list[prefill.PrefillRow]) -> None:
        hits = 0
        for row in rows:
            for i, job in enumerate(row.jobs):
                job.cached_tokens = row.cached if i == 0 else len(row.ids)
                hits += job.cached_tokens
        queried = sum(len(row.ids) * len(row.jobs) for row in rows)
        self.metrics.observe_prefix_cache(hits, queried)

    def _record_prompt_logprobs(self, row: prefill.PrefillRow, logits: torch.Tensor) -> None:
        for job in row.jobs:
            start = job.options.input_logprob_start
            if start is None:
                continue
            temperature = 1.0 if job.params.greedy or self.config.raw_logprobs else job.params.temperature
            job.input_logprobs, job.input_top_logprobs = prefill.prompt_logprobs(
                logits, row, start, temperature, job.options.top_logprobs_num
            )

    # -- decode ---------------------------------------------------------------------------------

    def _decode(self) -> None:
        batch = self._batch
        assert batch is not None
        width = batch.mask.shape[1]
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.jobs), 1))], dim=1)
        try:
            logits = self._forward_decode(batch)
        except Exception as exc:
            batch_cache.truncate(batch.cache, width)
            batch.mask = batch.mask[:, :width]
            self._batch = self._decode_rows_alone(batch, exc)
            return
        self._batch = self._finish_decode(batch, logits)

    def _forward_decode(self, batch: _Batch) -> torch.Tensor:
        out = self.model(
            input_ids=batch.tokens.unsqueeze(1),
            attention_mask=batch.mask,
            position_ids=batch.positions.unsqueeze(1),
            past_key_values=batch.cache,
            use_cache=True,
        )
        self.metrics.observe_batch(len(batch.jobs))
        batch.cache = out.past_key_values
        return out.logits[:, -1, :]  # type: ignore[no-any-return]

    def _finish_decode(self, batch: _Batch, logits: torch.Tensor) -> _Batch | None:
        batch.positions = batch.positions + 1
        if batch.rows is None:
            batch.rows = self._row_sampling(batch.jobs)
        result = self._sample(logits, batch.rows)
        batch.tokens = result.tokens
        new = self._retire(batch, result)
        self.metrics.set("running_requests", len(new.jobs) if new else 0)
        return new

    def _decode_rows_alone(self, batch: _Batch, exc: Exception) -> _Batch | None:
        """After a failed decode forward: run each row by itself, fail the ones that still fail."""
        if len(batch.jobs) == 1:
            self._fail(batch.jobs[0], exc, "decode")
            return None
        log.warning("decode step of %d rows failed (%r); retrying row by row", len(batch.jobs), exc)
        survivors: list[_Batch] = []
        logits: list[torch.Tensor] = []
        width = batch.mask.shape[1]
        for row, job in enumerate(batch.jobs):
            index = torch.tensor([row], device=self.device)
            single = _Batch(
                jobs=[job],
                cache=batch_cache.take_rows(batch.cache, index),
                mask=torch.cat([batch.mask[index], batch.mask.new_ones((1, 1))], dim=1),
                tokens=batch.tokens[index],
                positions=batch.positions[index],
            )
            try:
                logits.append(self._forward_decode(single))
            except Exception as row_exc:
                self._fail(job, row_exc, "decode")
                continue
            survivors.append(single)
        if not survivors:
            return None
        merged = _Batch(
            jobs=[s.jobs[0] for s in survivors],
            cache=batch_cache.stack_rows([s.cache for s in survivors]),
            mask=torch.cat([s.mask for s in survivors]),
            tokens=torch.cat([s.tokens for s in survivors]),
            positions=torch.cat([s.positions for s in survivors]),
        )
        assert merged.mask.shape[1] == width + 1
        return self._finish_decode(merged, torch.cat(logits))

    # -- sampling and retiring -----------------------------------------------------------------

    def _row_sampling(self, jobs: list[Job]) -> RowSampling:
        generators = [_request_generator(job, self.device) for job in jobs]
        return RowSampling.build(
            [job.params for job in jobs],
            [job.output_ids for job in jobs],
            [job.stop_ids for job in jobs],
            generators,
            self.vocab_size,
            self.device,
            top_logprobs_num=max(job.options.top_logprobs_num for job in jobs),
            guides=[job.guide for job in jobs],
        )

    def _sample(self, logits: torch.Tensor, rows: RowSampling) -> SampleResult:
        result = sample_tokens(logits, rows, self._generator, raw=self.config.raw_logprobs)
        rows.advance(result.tokens)
        return result

    def _retire(self, batch: _Batch, result: SampleResult) -> _Batch | None:
        """Record this step's tokens; finish and drop the rows that are done or failed."""
        tokens, logprobs, ok = result.tokens.tolist(), result.logprobs.tolist(), result.ok.tolist()
        tops = _top_lists(result)
        keep: list[int] = []
        for row, job in enumerate(batch.jobs):
            try:
                if not ok[row]:
                    raise RequestFailedError(
                        "sampling: the model's next-token distribution is not finite (NaN or inf "
                        f"logits) at output token {len(job.output_ids)}; the request was failed"
                    )
                job.append(self.tokenizer, tokens[row], logprobs[row], tops[row] if tops else None)
                if job.finish is None:
                    job.flush_chunk()
                    keep.append(row)
                    continue
                self._cache_output(batch, row, job)
                self._complete(job)
            except Exception as exc:
                self._fail(job, exc, "sampling")
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

    def _cache_output(self, batch: _Batch, row: int, job: Job) -> None:
        """Cache prompt + output (all but the last token, whose KV is not computed) for next turns."""
        fed = len(job.output_ids) - 1
        if self.prefix_cache is None or not self.config.cache_outputs or fed <= 0:
            return
        if job.finish is not None and job.finish.get("type") == "abort":
            return
        width = batch.mask.shape[1]
        columns = torch.arange(width - fed, width, device=self.device)
        kv = batch_cache.row_kv(batch.cache, columns, row)
        self.prefix_cache.insert(job.input_ids + job.output_ids[:-1], kv, len(job.input_ids))

    def _complete(self, job: Job) -> None:
        assert job.finish is not None
        self.metrics.observe_latency(time.monotonic() - job.arrived_s)
        job.complete(
            GenerationOutput(
                output_ids=job.output_ids,
                logprobs=job.logprobs,
                text=job.final_text(self.tokenizer),
                finish_reason=job.finish,
                weight_version=self._version,
                prompt_tokens=len(job.input_ids),
                cached_tokens=job.cached_tokens,
                top_logprobs=job.top_logprobs,
                input_logprobs=job.input_logprobs,
                input_top_logprobs=job.input_top_logprobs,
                input_logprob_start=job.options.input_logprob_start or 0,
            )
        )

    def _fail(self, job: Job, exc: BaseException, stage: str) -> None:
        """Fail one request with a clear error; the others go on."""
        if job.done:
            return
        log.warning("request %s failed during %s: %r", job.rid or "-", stage, exc)
        error = (
            exc
            if isinstance(exc, RequestFailedError)
            else RequestFailedError(f"{stage}: {type(exc).__name__}: {exc}")
        )
        if error is not exc:
            error.__cause__ = exc
        self.metrics.inc("requests_failed_total")
        job.fail(error)

    # -- weight swap and cache flush -----------------------------------------------------------

    def _maybe_flush(self) -> None:
        if not self._flush_requested:
            return
        with self._cond:
            self._flush_requested = False
        if self.prefix_cache is not None:
            self.prefix_cache.flush()
            self.metrics.set("prefix_cache_tokens", 0)

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
        if self.prefix_cache is not None:
            self.prefix_cache.flush()  # the cached KV was computed by the old weights
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
        return len(jobs)

    def _fail_in_flight(self, exc: Exception) -> None:
        for job in [*self._in_flight, *self._running()]:
            self._fail(job, exc, "engine step")
        self._in_flight = []
        self._batch = None

    def _fail_all(self, exc: Exception) -> None:
        with self._cond:
            waiting, self._waiting = list(self._waiting), deque()
            swap, self._swap = self._swap, None
        for job in [*self._in_flight, *self._running(), *waiting]:
            if not job.done:
                self.metrics.inc("requests_failed_total")
                job.fail(exc)
        self._in_flight = []
        self._batch = None
        if swap is not None and not swap.future.done():
            swap.future.set_exception(exc)

    def _empty_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)


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


def _request_generator(job: Job, device: torch.device) -> torch.Generator | None:
    """The request's own RNG when it set `sampling_seed`, advanced past the tokens it has."""
    seed = job.params.sampling_seed
    if seed is None or job.params.greedy:
        return None
    if job.generator is None:
        job.generator = torch.Generator(device=device).manual_seed(seed)
    return job.generator  # type: ignore[no-any-return]


def _top_lists(result: SampleResult) -> list[list[tuple[float, int]]] | None:
    if result.top_ids is None or result.top_logprobs is None:
        return None
    return [
        list(zip(values, ids, strict=True))
        for values, ids in zip(result.top_logprobs.tolist(), result.top_ids.tolist(), strict=True)
    ]


def _unique(jobs: list[Job]) -> list[Job]:
    """`jobs` without repeats, in order (a job being admitted is also in the new batch)."""
    return list({id(job): job for job in jobs}.values())


def _join(old: _Batch, new: _Batch) -> _Batch:
    cache, mask = batch_cache.concat_rows(old.cache, old.mask, new.cache, new.mask)
    return _Batch(
        jobs=old.jobs + new.jobs,
        cache=cache,
        mask=mask,
        tokens=torch.cat([old.tokens, new.tokens]),
        positions=torch.cat([old.positions, new.positions]),
    )
