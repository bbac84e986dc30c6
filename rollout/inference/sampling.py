"""Sampling: per-request parameters and pure functions from logits to tokens and logprobs.

Legend: B = rows in the decode batch, V = vocabulary size, K = top logprobs per row.
Processing order (as SGLang): logit bias, the grammar's mask (constrained decoding), min-new-tokens
ban of stop ids, penalties on the tokens generated so far (repetition: CTRL-style scaling;
frequency and presence: OpenAI-style subtraction), temperature, then top-k / top-p / min-p
truncation and sampling.
Logprobs are those of the chosen token under the processed, temperature-scaled distribution
*before* truncation (with no penalty or bias that is log_softmax(logits / T), what a trainer
recomputes); greedy rows use T = 1. `raw=True` always reports log_softmax(logits).
A row whose distribution is not finite (NaN or inf logits) is flagged in `SampleResult.ok` and
gets a placeholder token; the engine fails that request alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stacx.rollout.inference.grammar import allowed_mask

if TYPE_CHECKING:
    import torch

    from stacx.rollout.inference.grammar import TokenGuide

__all__ = [
    "SAMPLING_EPS",
    "RowSampling",
    "SampleResult",
    "SamplingParams",
    "apply_penalties",
    "sample_tokens",
    "truncate_logits",
]

SAMPLING_EPS = 1e-6
"""Temperatures below this are greedy (SGLang's floor): dividing logits by them overflows."""


@dataclass(kw_only=True, slots=True)
class SamplingParams:
    """How one request samples (the `sampling_params` of SGLang's `/generate`, same names)."""

    max_new_tokens: int = 128
    """Upper bound on generated tokens; 0 runs the prefill only (prompt logprobs)."""
    min_new_tokens: int = 0
    """Stop tokens (EOS, `stop_token_ids`) are banned until this many tokens exist."""
    temperature: float = 1.0
    """0 (or anything below `SAMPLING_EPS`) means greedy."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1]."""
    top_k: int = -1
    """Keep the k most likely tokens; -1 (or 0) keeps all."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the best token's."""
    frequency_penalty: float = 0.0
    """Subtract this times the token's count in the output so far (OpenAI semantics)."""
    presence_penalty: float = 0.0
    """Subtract this once from every token already in the output."""
    repetition_penalty: float = 1.0
    """Divide positive (multiply negative) logits of output tokens by this (1 = off)."""
    logit_bias: dict[int, float] = field(default_factory=dict)
    """Added to the logits of these token ids before anything else."""
    stop: list[str] = field(default_factory=list)
    """Stop strings: generation ends once the decoded text contains one."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Token ids that end generation, besides the model's EOS ids."""
    stop_regex: list[str] = field(default_factory=list)
    """Regular expressions that end generation once the decoded text matches one."""
    ignore_eos: bool = False
    """Keep going past EOS ids (benchmarks)."""
    skip_special_tokens: bool = True
    """Drop special tokens from the returned text."""
    no_stop_trim: bool = False
    """Keep the matched stop string / token in the returned text."""
    sampling_seed: int | None = None
    """Seed of this request's own generator: same seed, same prompt, same output."""
    regex: str | None = None
    """Constrain the output to this regular expression (rollout/inference/grammar.py)."""
    json_schema: str | None = None
    """Constrain the output to JSON valid under this schema (a JSON string)."""

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS or self.top_k == 1

    @property
    def penalized(self) -> bool:
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0)


@dataclass(slots=True)
class SampleResult:
    """One sampling step for B rows."""

    tokens: torch.Tensor
    """[B] chosen token ids."""
    logprobs: torch.Tensor
    """[B] their logprobs."""
    ok: torch.Tensor
    """[B] bool: False where the row's distribution was not finite (the token is a placeholder)."""
    top_ids: torch.Tensor | None = None
    """[B, K] most likely token ids (K = the largest `top_logprobs_num` in the batch)."""
    top_logprobs: torch.Tensor | None = None
    """[B, K] their logprobs."""


@dataclass(slots=True)
class RowSampling:
    """Per-row sampling tensors of a batch, built once per batch composition.

    `counts` [B, V] (output-token counts, only when some row has a penalty) and `num_generated`
    [B] advance each step through `advance`.
    """

    temperature: torch.Tensor  # [B] float, 1.0 on greedy rows
    greedy: torch.Tensor  # [B] bool
    top_k: torch.Tensor  # [B] long
    top_p: torch.Tensor  # [B] float
    min_p: torch.Tensor  # [B] float
    all_greedy: bool
    needs_truncation: bool
    generators: list[torch.Generator | None]
    """Per-row seeded generators (None: the engine's shared one)."""
    num_generated: torch.Tensor  # [B] long
    min_new_tokens: torch.Tensor | None = None  # [B] long
    stop_ban: torch.Tensor | None = None  # [B, V] bool: stop ids banned before min_new_tokens
    logit_bias: torch.Tensor | None = None  # [B, V] float
    counts: torch.Tensor | None = None  # [B, V] float
    frequency: torch.Tensor | None = None  # [B, 1]
    presence: torch.Tensor | None = None  # [B, 1]
    repetition: torch.Tensor | None = None  # [B, 1]
    top_logprobs_num: int = 0
    guides: list[TokenGuide | None] | None = None
    """Constrained-decoding guides of the rows (None: no row is constrained)."""

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        outputs: list[list[int]],
        stop_ids: list[frozenset[int]],
        generators: list[torch.Generator | None],
        vocab_size: int,
        device: torch.device,
        top_logprobs_num: int = 0,
        guides: list[TokenGuide | None] | None = None,
    ) -> RowSampling:
        """Tensors for rows with these params, outputs so far and stop ids."""
        import torch

        greedy = [p.greedy for p in params]
        rows = cls(
            temperature=_floats(
                [1.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)], device
            ),
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.long, device=device),
            top_p=_floats([p.top_p for p in params], device),
            min_p=_floats([p.min_p for p in params], device),
            all_greedy=all(greedy),
            needs_truncation=any(p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0 for p in params),
            generators=generators,
            num_generated=torch.tensor([len(o) for o in outputs], dtype=torch.long, device=device),
            top_logprobs_num=top_logprobs_num,
            guides=guides if guides and any(g is not None for g in guides) else None,
        )
        if any(p.min_new_tokens > 0 for p in params):
            rows.min_new_tokens = torch.tensor([p.min_new_tokens for p in params], device=device)
            rows.stop_ban = _row_masks([sorted(s) for s in stop_ids], vocab_size, device)
        if any(p.logit_bias for p in params):
            rows.logit_bias = torch.zeros(len(params), vocab_size, device=device)
            for row, p in enumerate(params):
                for token, bias in p.logit_bias.items():
                    rows.logit_bias[row, token] = bias
        if any(p.penalized for p in params):
            rows.counts = torch.zeros(len(params), vocab_size, device=device)
            for row, out in enumerate(outputs):
                if out:
                    rows.counts[row].index_add_(
                        0, torch.tensor(out, device=device), torch.ones(len(out), device=device)
                    )
            rows.frequency = _floats([p.frequency_penalty for p in params], device).unsqueeze(1)
            rows.presence = _floats([p.presence_penalty for p in params], device).unsqueeze(1)
            rows.repetition = _floats([p.repetition_penalty for p in params], device).unsqueeze(1)
        return rows

    def advance(self, tokens: torch.Tensor) -> None:
        """Count this step's tokens [B]."""
        self.num_generated += 1
        if self.counts is not None:
            self.counts.scatter_add_(1, tokens.unsqueeze(1), self.counts.new_ones(len(tokens), 1))

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """Bias, grammar mask, min-new-tokens ban and penalties applied to float logits [B, V] (unscaled)."""
        if self.logit_bias is not None:
            logits = logits + self.logit_bias
        if self.guides is not None:
            banned = allowed_mask(self.guides, logits.shape[-1], logits.device)
            logits = logits.masked_fill(banned, float("-inf"))
        if self.stop_ban is not None and self.min_new_tokens is not None:
            early = (self.num_generated < self.min_new_tokens).unsqueeze(1)  # [B, 1]
            logits = logits.masked_fill(self.stop_ban & early, float("-inf"))
        if self.counts is not None:
            assert self.frequency is not None and self.presence is not None and self.repetition is not None
            logits = apply_penalties(logits, self.counts, self.frequency, self.presence, self.repetition)
        return logits


def _floats(values: list[float], device: torch.device) -> torch.Tensor:
    import torch

    return torch.tensor(values, dtype=torch.float32, device=device)


def _row_masks(ids: list[list[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    import torch

    mask = torch.zeros(len(ids), vocab_size, dtype=torch.bool, device=device)
    for row, row_ids in enumerate(ids):
        valid = [i for i in row_ids if 0 <= i < vocab_size]
        if valid:
            mask[row, valid] = True
    return mask


def apply_penalties(
    logits: torch.Tensor,
    counts: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    repetition: torch.Tensor,
) -> torch.Tensor:
    """Penalise tokens already generated. logits, counts: [B, V]; the three penalties: [B, 1]."""
    import torch

    seen = counts > 0  # [B, V]
    scaled = torch.where(logits < 0, logits * repetition, logits / repetition)
    logits = torch.where(seen, scaled, logits)
    return logits - frequency * counts - presence * seen.float()


def truncate_logits(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor | None = None
) -> torch.Tensor:
    """Set logits outside each row's top-k / top-p / min-p set to -inf.

    logits: [B, V]; top_k: [B] int (<= 0 keeps all); top_p: [B] float in (0, 1]; min_p: [B] in [0, 1].
    """
    import torch

    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [B, V]
    ranks = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)  # [1, V]
    k = torch.where(top_k > 0, top_k, logits.shape[-1]).unsqueeze(1)  # [B, 1]
    drop_sorted = ranks >= k
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly better tokens
    drop_sorted |= mass_before >= top_p.unsqueeze(1)
    if min_p is not None:
        drop_sorted |= probs < (min_p.unsqueeze(1) * probs[:, :1])
    drop_sorted[:, 0] = False  # always keep the best token
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample_tokens(
    logits: torch.Tensor,
    rows: RowSampling,
    generator: torch.Generator | None = None,
    raw: bool = False,
) -> SampleResult:
    """Pick one token per row from logits [B, V] (processing: see the module docstring)."""
    import torch

    logits = rows.process(logits.float())
    scaled = logits / rows.temperature.unsqueeze(1)  # [B, V]
    ok = _sampleable(scaled)
    if not bool(ok.all()):
        scaled = torch.where(ok.unsqueeze(1), scaled, torch.zeros_like(scaled))  # placeholder rows
        logits = torch.where(ok.unsqueeze(1), logits, torch.zeros_like(logits))
    tokens = torch.argmax(scaled, dim=-1)  # [B]
    if not rows.all_greedy:
        candidates = (
            truncate_logits(scaled, rows.top_k, rows.top_p, rows.min_p) if rows.needs_truncation else scaled
        )
        probs = torch.softmax(candidates, dim=-1)
        sampled = _draw(probs, rows.generators, generator)
        tokens = torch.where(rows.greedy, tokens, sampled)
    full = torch.log_softmax(logits if raw else scaled, dim=-1)  # [B, V]
    result = SampleResult(tokens=tokens, logprobs=full.gather(1, tokens.unsqueeze(1)).squeeze(1), ok=ok)
    if rows.top_logprobs_num > 0:
        k = min(rows.top_logprobs_num, full.shape[-1])
        result.top_logprobs, result.top_ids = torch.topk(full, k, dim=-1)
    return result


def _sampleable(scaled: torch.Tensor) -> torch.Tensor:
    """[B] bool: no NaN or +inf, and at least one finite logit (-inf only masks tokens)."""
    import torch

    no_nan_or_inf = (~torch.isnan(scaled) & (scaled != float("inf"))).all(dim=-1)
    return no_nan_or_inf & torch.isfinite(scaled).any(dim=-1)


def _draw(
    probs: torch.Tensor, generators: list[torch.Generator | None], shared: torch.Generator | None
) -> torch.Tensor:
    """One multinomial draw per row [B, V] -> [B]; seeded rows use their own generator."""
    import torch

    seeded = [row for row, g in enumerate(generators) if g is not None]
    if not seeded:
        return torch.multinomial(probs, 1, generator=shared).squeeze(1)
    tokens = (
        torch.multinomial(probs, 1, generator=shared).squeeze(1) if len(seeded) < len(generators) else None
    )
    if tokens is None:
        tokens = torch.zeros(probs.shape[0], dtype=torch.long, device=probs.device)
    for row in seeded:
        tokens[row] = torch.multinomial(probs[row], 1, generator=generators[row])[0]
    return tokens
