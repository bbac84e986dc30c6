"""Every recipe's loss against reference implementations of the field's published formulas.

The references below are written from the documented math of verl (`core_algos.py`: `agg_loss`,
`compute_policy_loss` with dual clip, `compute_policy_loss_gspo`, `kl_penalty`, GRPO / RLOO /
REINFORCE++ / GAE advantages, `masked_whiten`) and TRL (`GRPOTrainer` loss types, KL term and
`vllm_importance_sampling_*`, `DPOTrainer` sigmoid loss), token by token and row by row, in
float64 on ragged batches with the edge cases that broke before: a zero-variance group, a group of
one, a fully masked row, length-1 responses, a row without recorded logprobs, ratios far outside
the clip band. Losses and gradients (d loss / d logprobs) must agree within 1e-9.

Where the two references differ we follow verl and say so: sequence means count only sequences
with at least one loss token (TRL divides by every row; identical without fully masked rows, which
`test_trl_loss_types` checks), and GRPO's group of one gets advantage 0 (TRL; verl uses mean 0,
std 1 there).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.losses import AGGREGATIONS, KL_ESTIMATORS, Aggregation
from stacx.trainer.recipe import get_recipe

F64 = torch.float64
TOL = 1e-9
BUDGET = 16  # constant length of seq-mean-token-sum-norm
T_WIDTH = 12


# ----------------------------------------------------------------------------- the batch


@dataclasses.dataclass
class Case:
    batch: TensorBatch
    logp: torch.Tensor  # [B, T] current policy logprobs (values; tests make leaves of them)
    rows: list[tuple[int, int]]  # (first, count) of each row's loss tokens


def ragged_case(seed: int, *, fully_masked: bool = True, unrecorded: bool = True) -> Case:
    """Groups of sizes 3, 1 (no baseline), 2 (equal rewards: zero variance), 4; responses of
    1..8 tokens at ragged offsets; optionally one fully masked row and one row without recorded
    logprobs. The current policy sits around the behaviour policy, a few tokens far outside."""
    gen = torch.Generator().manual_seed(seed)
    sizes = [3, 1, 2, 4]
    group_index = torch.tensor([g for g, n in enumerate(sizes) for _ in range(n)])
    b = len(group_index)
    rewards = torch.rand(b, generator=gen, dtype=F64)
    rewards[4:6] = 0.25  # the zero-variance group
    mask = torch.zeros(b, T_WIDTH, dtype=F64)
    rows = []
    for i in range(b):
        count = 1 if i in (0, 6) else int(torch.randint(2, 9, (1,), generator=gen))
        first = int(torch.randint(0, T_WIDTH - count + 1, (1,), generator=gen))
        if fully_masked and i == 8:
            count = 0
        mask[i, first:first + count] = 1.0
        rows.append((first, count))
    old = -torch.rand(b, T_WIDTH, generator=gen, dtype=F64) * 3 - 0.05
    logp = old + 0.25 * torch.randn(b, T_WIDTH, generator=gen, dtype=F64)
    logp[1, rows[1][0]] = old[1, rows[1][0]] + 3.0  # ratio e^3: clipped (A > 0) or dual-clipped
    logp[3, rows[3][0]] = old[3, rows[3][0]] + 30.0  # log-ratio past the +-20 clamp
    recorded = torch.ones(b, dtype=torch.bool)
    if unrecorded:
        recorded[2] = False
    ids = torch.zeros(b, T_WIDTH + 1, dtype=torch.long)
    batch = TensorBatch(
        batch_id=f"ref{seed}", input_ids=ids, attention_mask=torch.ones_like(ids), loss_mask=mask,
        old_logprobs=old * mask, rewards=rewards, group_index=group_index,
        lengths=torch.full((b,), T_WIDTH + 1), temperatures=torch.ones(b, dtype=F64),
        logprobs_recorded=recorded,
        extras={"ref_logprobs": logp + 0.3 * torch.randn(b, T_WIDTH, generator=gen, dtype=F64),
                "teacher_logprobs": old + 0.5 * torch.randn(b, T_WIDTH, generator=gen,
                                                            dtype=F64),
                "values": torch.randn(b, T_WIDTH, generator=gen, dtype=F64),
                "rm_scores": torch.randn(b, generator=gen, dtype=F64)})
    return Case(batch=batch, logp=logp, rows=rows)


def behaviour(case: Case, logp: torch.Tensor) -> torch.Tensor:
    """Recorded logprobs; a row without them is scored against the current policy (ratio 1)."""
    out = case.batch.old_logprobs.clone()
    for i, rec in enumerate(case.batch.logprobs_recorded.tolist()):  # type: ignore[union-attr]
        if not rec:
            out[i] = logp[i].detach()
    return out


# ----------------------------------------------------------------------------- references


def ref_aggregate(per_token: torch.Tensor, case: Case, how: str, budget: int = BUDGET
                  ) -> torch.Tensor:
    """verl `agg_loss` (global form), row by row; N counts sequences with a loss token."""
    terms, tokens = [], 0
    for i, (first, count) in enumerate(case.rows):
        if count == 0:
            continue
        row_sum = per_token[i, first:first + count].sum()
        tokens += count
        terms.append({"token-mean": row_sum, "seq-mean-token-mean": row_sum / count,
                      "seq-mean-token-sum": row_sum,
                      "seq-mean-token-sum-norm": row_sum / budget}[how])
    total = torch.stack(terms).sum()
    return total / tokens if how == "token-mean" else total / len(terms)


def ref_group_advantages(rewards: torch.Tensor, groups: torch.Tensor, scale: bool = True,
                         eps: float = 1e-6) -> torch.Tensor:
    out = torch.zeros_like(rewards)
    for g in groups.unique().tolist():
        idx = (groups == g).nonzero().flatten().tolist()
        if len(idx) == 1:
            continue  # no baseline
        r = rewards[idx]
        mean = sum(r.tolist()) / len(idx)
        std = math.sqrt(sum((x - mean) ** 2 for x in r.tolist()) / (len(idx) - 1))
        for i in idx:
            out[i] = (rewards[i] - mean) / (std + eps) if scale else rewards[i] - mean
    return out


def ref_rloo_advantages(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(rewards)
    for i in range(len(rewards)):
        others = [rewards[j].item() for j in range(len(rewards))
                  if groups[j] == groups[i] and j != i]
        if others:
            out[i] = rewards[i] - sum(others) / len(others)
    return out


def ref_ppo_token(lp: torch.Tensor, old: float, adv: float, lo: float, hi: float,
                  c: float | None) -> torch.Tensor:
    """verl vanilla policy loss of one token (clamped log-ratio, clip, dual clip)."""
    ratio = torch.exp(torch.clamp(lp - old, -20.0, 20.0))
    loss = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - lo, 1 + hi))
    if c is not None and adv < 0:
        loss = torch.minimum(loss, torch.tensor(-adv * c, dtype=F64))
    return loss


def ref_ppo_matrix(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, case: Case,
                   lo: float, hi: float, c: float | None) -> torch.Tensor:
    """Per-token PPO losses [B, T] (0 off the mask); adv is [B] or [B, T]."""
    rows_out = []
    for i, (first, count) in enumerate(case.rows):
        row = [torch.tensor(0.0, dtype=F64)] * T_WIDTH
        for t in range(first, first + count):
            a = float(adv[i] if adv.dim() == 1 else adv[i, t])
            row[t] = ref_ppo_token(logp[i, t], float(old[i, t]), a, lo, hi, c)
        rows_out.append(torch.stack(row))
    return torch.stack(rows_out)


def ref_kl(logp: torch.Tensor, ref: torch.Tensor, estimator: str) -> torch.Tensor:
    """verl `kl_penalty`: k1, k2 (mse), k3 (low_var_kl, clamped)."""
    d = logp - ref
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d.square()
    x = torch.clamp(-d, -20.0, 20.0)
    return torch.clamp(torch.exp(x) - x - 1, -10.0, 10.0)


def ref_whiten(x: torch.Tensor, case: Case) -> torch.Tensor:
    """verl masked_whiten: unbiased variance over the masked tokens, rsqrt(var + 1e-8)."""
    vals = torch.cat([x[i, f:f + n] for i, (f, n) in enumerate(case.rows)])
    mean = vals.mean()
    var = ((vals - mean) ** 2).sum() / (vals.numel() - 1)
    return (x - mean) * torch.rsqrt(var + 1e-8)


def ref_returns(token_rewards: torch.Tensor, case: Case, gamma: float) -> torch.Tensor:
    out = torch.zeros_like(token_rewards)
    for i, (first, count) in enumerate(case.rows):
        running = torch.tensor(0.0, dtype=F64)
        for t in reversed(range(first, first + count)):
            running = token_rewards[i, t] + gamma * running
            out[i, t] = running
    return out


def ref_gae(rewards: torch.Tensor, values: torch.Tensor, case: Case, gamma: float,
            lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    adv = torch.zeros_like(values)
    for i, (first, count) in enumerate(case.rows):
        next_v, next_a = 0.0, 0.0
        for t in reversed(range(first, first + count)):
            delta = rewards[i, t] + gamma * next_v - values[i, t]
            next_a = delta + gamma * lam * next_a
            adv[i, t] = next_a
            next_v = values[i, t]
    mask = case.batch.loss_mask
    return adv, (adv + values) * mask


def terminal(case: Case) -> torch.Tensor:
    out = torch.zeros_like(case.batch.loss_mask)
    for i, (first, count) in enumerate(case.rows):
        if count:
            out[i, first + count - 1] = case.batch.rewards[i]
    return out


# ----------------------------------------------------------------------------- harness


def policy_spec(recipe: str, **options: Any) -> Any:
    config = get_recipe(recipe)
    spec = next(r.specialization for r in config.roles if r.name == "policy")
    return dataclasses.replace(spec, **options)


def ours(spec: Any, case: Case, output: str = "logprobs") -> tuple[torch.Tensor, torch.Tensor]:
    batch = spec.prepare_batch(case.batch)
    leaf = (case.logp if output == "logprobs" else case.batch.extras["values"]).clone()
    leaf.requires_grad_(True)
    loss, _ = spec.compute_loss({output: leaf}, batch)
    loss.backward()
    assert leaf.grad is not None
    return loss.detach(), leaf.grad


def reference(fn: Any, case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = case.logp.clone().requires_grad_(True)
    loss = fn(leaf)
    loss.backward()
    assert leaf.grad is not None
    return loss.detach(), leaf.grad


def assert_same(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor],
                what: str) -> None:
    assert abs(got[0].item() - want[0].item()) < TOL, f"{what}: loss {got[0]} != {want[0]}"
    gap = (got[1] - want[1]).abs().max().item()
    assert gap < TOL, f"{what}: gradients differ by {gap}"
    assert got[1].abs().sum() > 0, f"{what}: no gradient at all"


SEEDS = [0, 1, 2]


# ----------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("how", AGGREGATIONS)
@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_grpo(seed: int, how: Aggregation, estimator: str) -> None:
    """GRPO (TRL / verl): group advantages, PPO clip with dual clip, beta * KL aggregated alike."""
    case = ragged_case(seed)
    spec = policy_spec("grpo", aggregation=how, max_tokens=BUDGET, kl_estimator=estimator,
                       kl_beta=0.1)
    adv = ref_group_advantages(case.batch.rewards, case.batch.group_index)

    def fn(logp: torch.Tensor) -> torch.Tensor:
        pg = ref_ppo_matrix(logp, behaviour(case, logp), adv, case, 0.2, 0.2, 3.0)
        kl = ref_kl(logp, case.batch.extras["ref_logprobs"], estimator)
        return ref_aggregate(pg, case, how) + 0.1 * ref_aggregate(kl, case, how)

    assert_same(ours(spec, case), reference(fn, case), f"grpo {how} {estimator}")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("recipe", ["dapo", "dr_grpo", "online_reward"])
def test_grpo_family_defaults(seed: int, recipe: str) -> None:
    """DAPO (clip-higher, token mean, no KL), Dr. GRPO (unscaled advantages, constant length
    2048, no KL) and the online-reward policy (GRPO on reward-model scores) as shipped."""
    case = ragged_case(seed)
    spec = policy_spec(recipe)
    rewards = case.batch.extras["rm_scores"] if recipe == "online_reward" else case.batch.rewards
    adv = ref_group_advantages(rewards, case.batch.group_index, scale=recipe != "dr_grpo")
    hi = 0.28 if recipe == "dapo" else 0.2
    how = {"dapo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm",
           "online_reward": "seq-mean-token-mean"}[recipe]

    def fn(logp: torch.Tensor) -> torch.Tensor:
        pg = ref_ppo_matrix(logp, behaviour(case, logp), adv, case, 0.2, hi, 3.0)
        return ref_aggregate(pg, case, how, budget=2048)

    assert_same(ours(spec, case), reference(fn, case), recipe)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("how", AGGREGATIONS)
def test_gspo(seed: int, how: Aggregation) -> None:
    """verl `gspo` (GSPO-token): s_i = exp(mean_t log-ratio) per token with stop-gradients."""
    case = ragged_case(seed)
    spec = policy_spec("gspo", aggregation=how, max_tokens=BUDGET)
    adv = ref_group_advantages(case.batch.rewards, case.batch.group_index)

    def fn(logp: torch.Tensor) -> torch.Tensor:
        old = behaviour(case, logp)
        rows = []
        for i, (first, count) in enumerate(case.rows):
            row = torch.zeros(T_WIDTH, dtype=F64)
            if count:
                seq = (logp[i, first:first + count] - old[i, first:first + count]).mean()
                for t in range(first, first + count):
                    s = torch.exp(torch.clamp(logp[i, t] - logp[i, t].detach() + seq.detach(),
                                              max=10.0))
                    a = float(adv[i])
                    row = row.index_put((torch.tensor([t]),), torch.maximum(
                        -a * s, -a * torch.clamp(s, 1 - 3e-4, 1 + 4e-4)).reshape(1))
            rows.append(row)
        return ref_aggregate(torch.stack(rows), case, how)

    assert_same(ours(spec, case), reference(fn, case), f"gspo {how}")


@pytest.mark.parametrize("seed", SEEDS)
def test_gspo_is_the_sequence_level_objective(seed: int) -> None:
    """With seq-mean-token-mean (the default) GSPO equals the paper's sequence form:
    mean_i max(-A_i s_i, -A_i clip(s_i)) over sequences with tokens."""
    case = ragged_case(seed)
    adv = ref_group_advantages(case.batch.rewards, case.batch.group_index)

    def fn(logp: torch.Tensor) -> torch.Tensor:
        old = behaviour(case, logp)
        terms = []
        for i, (first, count) in enumerate(case.rows):
            if count:
                s = torch.exp((logp[i, first:first + count] - old[i, first:first + count]).mean())
                a = float(adv[i])
                terms.append(torch.maximum(-a * s, -a * torch.clamp(s, 1 - 3e-4, 1 + 4e-4)))
        return torch.stack(terms).mean()

    assert_same(ours(policy_spec("gspo"), case), reference(fn, case), "gspo sequence form")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("how", AGGREGATIONS)
def test_rloo(seed: int, how: Aggregation) -> None:
    case = ragged_case(seed)
    spec = policy_spec("rloo", aggregation=how, max_tokens=BUDGET)
    adv = ref_rloo_advantages(case.batch.rewards, case.batch.group_index)

    def fn(logp: torch.Tensor) -> torch.Tensor:
        return ref_aggregate(ref_ppo_matrix(logp, behaviour(case, logp), adv, case, 0.2, 0.2,
                                            3.0), case, how)

    assert_same(ours(spec, case), reference(fn, case), f"rloo {how}")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("how", AGGREGATIONS)
@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_reinforce_pp(seed: int, how: Aggregation, estimator: str) -> None:
    """verl REINFORCE++: r_t = -beta KL(old, ref) + reward on the last token, returns-to-go,
    whitened over the batch (unbiased), PPO clip with dual clip."""
    case = ragged_case(seed)
    spec = policy_spec("reinforce_pp", aggregation=how, max_tokens=BUDGET, kl_estimator=estimator,
                       kl_beta=0.05, gamma=0.9)

    def fn(logp: torch.Tensor) -> torch.Tensor:
        old = behaviour(case, logp)
        kl = ref_kl(old, case.batch.extras["ref_logprobs"], estimator) * case.batch.loss_mask
        returns = ref_returns(terminal(case) - 0.05 * kl, case, 0.9)
        adv = ref_whiten(returns, case) * case.batch.loss_mask
        return ref_aggregate(ref_ppo_matrix(logp, old, adv, case, 0.2, 0.2, 3.0), case, how)

    assert_same(ours(spec, case), reference(fn, case), f"reinforce_pp {how} {estimator}")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("how", AGGREGATIONS)
def test_ppo_policy(seed: int, how: Aggregation) -> None:
    """verl PPO: GAE (observation tokens skipped), advantages whitened over the batch, clip."""
    case = ragged_case(seed)
    spec = policy_spec("ppo", aggregation=how, max_tokens=BUDGET, gamma=0.95, lam=0.9)
    adv, _ = ref_gae(terminal(case), case.batch.extras["values"], case, 0.95, 0.9)
    adv = ref_whiten(adv, case) * case.batch.loss_mask

    def fn(logp: torch.Tensor) -> torch.Tensor:
        return ref_aggregate(ref_ppo_matrix(logp, behaviour(case, logp), adv, case, 0.2, 0.2,
                                            3.0), case, how)

    assert_same(ours(spec, case), reference(fn, case), f"ppo {how}")


@pytest.mark.parametrize("seed", SEEDS)
def test_ppo_critic(seed: int) -> None:
    """The critic regresses GAE returns (detached targets): 0.5 * token-mean (V - R)^2."""
    case = ragged_case(seed)
    critic = next(r.specialization for r in get_recipe("ppo").roles if r.name == "critic")
    values = case.batch.extras["values"]
    _, returns = ref_gae(terminal(case), values, case, critic.gamma, critic.lam)

    leaf = values.clone().requires_grad_(True)
    loss = 0.5 * ref_aggregate((leaf - returns) ** 2, case, "token-mean")
    loss.backward()
    assert leaf.grad is not None
    assert_same(ours(critic, case, output="values"), (loss.detach(), leaf.grad), "critic")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("how", AGGREGATIONS)
def test_opd(seed: int, how: Aggregation) -> None:
    """On-policy distillation: sg(log s - log t) * log s per token (reverse-KL score function)."""
    case = ragged_case(seed)
    spec = policy_spec("opd", aggregation=how, max_tokens=BUDGET)
    teacher = case.batch.extras["teacher_logprobs"]

    def fn(logp: torch.Tensor) -> torch.Tensor:
        return ref_aggregate((logp - teacher).detach() * logp, case, how)

    assert_same(ours(spec, case), reference(fn, case), f"opd {how}")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("how", AGGREGATIONS)
def test_sft(seed: int, how: Aggregation) -> None:
    case = ragged_case(seed)
    spec = policy_spec("sft", aggregation=how, max_tokens=BUDGET)
    assert_same(ours(spec, case), reference(lambda lp: ref_aggregate(-lp, case, how), case),
                f"sft {how}")


@pytest.mark.parametrize("seed", SEEDS)
def test_dpo(seed: int) -> None:
    """TRL sigmoid DPO on each group's (highest, lowest reward) pair, with label smoothing."""
    case = ragged_case(seed)
    spec = policy_spec("dpo", beta=0.2, label_smoothing=0.1)
    ref = case.batch.extras["ref_logprobs"]

    def fn(logp: torch.Tensor) -> torch.Tensor:
        def seq(x: torch.Tensor, i: int) -> torch.Tensor:
            first, count = case.rows[i]
            return x[i, first:first + count].sum()

        terms = []
        for g in case.batch.group_index.unique().tolist():
            idx = (case.batch.group_index == g).nonzero().flatten().tolist()
            if len(idx) < 2:
                continue
            order = sorted(idx, key=lambda i: (-case.batch.rewards[i].item(), idx.index(i)))
            c, r = order[0], order[-1]
            z = 0.2 * ((seq(logp, c) - seq(ref, c)) - (seq(logp, r) - seq(ref, r)))
            terms.append(-0.9 * torch.nn.functional.logsigmoid(z)
                         - 0.1 * torch.nn.functional.logsigmoid(-z))
        return torch.stack(terms).mean()

    assert_same(ours(spec, case), reference(fn, case), "dpo")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", ["token-truncate", "token-mask", "sequence-truncate",
                                  "sequence-mask"])
def test_off_policy_correction(seed: int, mode: str) -> None:
    """TRL `vllm_importance_sampling_*`: PPO around pi_old (the trainer's detached logprobs),
    each token's policy loss times rho = pi_old / mu, truncated at C or masked above C; the KL
    term is not reweighted. Sequence modes use prod_t rho_t."""
    case = ragged_case(seed)
    spec = policy_spec("grpo", off_policy=mode, off_policy_cap=1.5, kl_beta=0.05)
    adv = ref_group_advantages(case.batch.rewards, case.batch.group_index)

    def fn(logp: torch.Tensor) -> torch.Tensor:
        mu, pi_old = behaviour(case, logp), logp.detach()
        per_token = ref_ppo_matrix(logp, pi_old, adv, case, 0.2, 0.2, 3.0)
        weights = torch.ones_like(logp)
        for i, (first, count) in enumerate(case.rows):
            span = slice(first, first + count)
            gaps = pi_old[i, span] - mu[i, span]
            rhos = [gaps.sum().clamp(-20, 20).exp()] * count if mode.startswith("sequence") \
                else list(gaps.clamp(-20, 20).exp())
            for k, rho in enumerate(rhos):
                w = torch.clamp(rho, max=1.5) if mode.endswith("truncate") \
                    else rho * float(rho <= 1.5)
                weights[i, first + k] = w
        kl = ref_kl(logp, case.batch.extras["ref_logprobs"], "k3")
        how = "seq-mean-token-mean"
        return ref_aggregate(per_token * weights, case, how) + 0.05 * ref_aggregate(kl, case, how)

    assert_same(ours(spec, case), reference(fn, case), f"off-policy {mode}")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_trl_loss_types(seed: int, loss_type: str) -> None:
    """TRL's GRPO loss types equal ours with the matching aggregation: grpo =
    seq-mean-token-mean, bnpo / dapo = token-mean, dr_grpo = sum / (B * L). TRL has neither the
    dual clip nor verl's k3 clamps, which only bite far out: the outlier row is brought back in."""
    case = ragged_case(seed, fully_masked=False)
    logp = case.logp.clone()
    logp[3] = case.batch.old_logprobs[3] + 0.1
    ref_logp = case.batch.extras["ref_logprobs"].clone()
    ref_logp[3] = logp[3] - 0.2
    case = dataclasses.replace(case, logp=logp, batch=case.batch.with_extras(ref_logprobs=ref_logp))
    how = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean",
           "dr_grpo": "seq-mean-token-sum-norm"}[loss_type]
    spec = policy_spec("grpo", aggregation=how, max_tokens=BUDGET, kl_beta=0.04, dual_clip=None)
    mask = case.batch.loss_mask
    adv = ref_group_advantages(case.batch.rewards, case.batch.group_index).unsqueeze(1)

    def fn(logp: torch.Tensor) -> torch.Tensor:
        coef_1 = torch.exp(logp - behaviour(case, logp))
        coef_2 = torch.clamp(coef_1, 1 - 0.2, 1 + 0.2)
        per_token = -torch.min(coef_1 * adv, coef_2 * adv)
        ref = case.batch.extras["ref_logprobs"]
        per_token = per_token + 0.04 * (torch.exp(ref - logp) - (ref - logp) - 1)
        if loss_type == "grpo":
            return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
        if loss_type == "dr_grpo":
            return (per_token * mask).sum() / (per_token.size(0) * BUDGET)
        return (per_token * mask).sum() / mask.sum()

    assert_same(ours(spec, case), reference(fn, case), f"trl {loss_type}")


# ----------------------------------------------------------------------------- the second set


def ref_seq(x: torch.Tensor, case: Case, i: int, mean: bool = False) -> torch.Tensor:
    """Sum (or mean) of row i's loss tokens, read from the row layout, not the mask."""
    first, count = case.rows[i]
    total = x[i, first:first + count].sum()
    return total / count if mean else total


def ref_pairs(case: Case) -> list[tuple[int, int]]:
    """(chosen, rejected) of each group of >= 2: highest and lowest reward, ties by position."""
    pairs = []
    for g in case.batch.group_index.unique().tolist():
        idx = (case.batch.group_index == g).nonzero().flatten().tolist()
        if len(idx) >= 2:
            order = sorted(idx, key=lambda i: (-case.batch.rewards[i].item(), idx.index(i)))
            pairs.append((order[0], order[-1]))
    return pairs


def logsig(x: torch.Tensor) -> torch.Tensor:
    return -torch.log1p(torch.exp(-x))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("how", AGGREGATIONS)
def test_cispo(seed: int, how: Aggregation) -> None:
    """TRL `cispo`: -sg(min(rho, eps_high)) * A * log pi per token (MiniMax-M1), group advantages,
    no min with an unclipped term: tokens far outside the band keep their gradient."""
    case = ragged_case(seed)
    spec = policy_spec("cispo", aggregation=how, max_tokens=BUDGET, ratio_cap=1.5)
    adv = ref_group_advantages(case.batch.rewards, case.batch.group_index)

    def fn(logp: torch.Tensor) -> torch.Tensor:
        old = behaviour(case, logp)
        per_token = torch.zeros_like(logp)
        for i, (first, count) in enumerate(case.rows):
            for t in range(first, first + count):
                rho = math.exp(max(-20.0, min(20.0, float(logp[i, t].detach() - old[i, t]))))
                per_token[i, t] = -min(rho, 1.5) * float(adv[i]) * logp[i, t]
        return ref_aggregate(per_token, case, how)

    assert_same(ours(spec, case), reference(fn, case), f"cispo {how}")


@pytest.mark.parametrize("seed", SEEDS)
def test_remax(seed: int) -> None:
    """ReMax: A_i = r_i - r(greedy row of i's group); greedy rows and groups without one are not
    trained; REINFORCE, sequence mean of token means over the trained rows."""
    case = ragged_case(seed, unrecorded=False)
    greedy = torch.zeros(case.batch.num_sequences, dtype=torch.bool)
    greedy[[0, 4]] = True  # groups 0 and 2 have a greedy row; 1 (one row) and 3 have none
    case = dataclasses.replace(case, batch=dataclasses.replace(case.batch, greedy=greedy))
    spec = policy_spec("remax")
    r, groups = case.batch.rewards, case.batch.group_index

    def fn(logp: torch.Tensor) -> torch.Tensor:
        terms = []
        for i, (first, count) in enumerate(case.rows):
            base = [j for j in range(len(r)) if groups[j] == groups[i] and greedy[j]]
            if count == 0 or greedy[i]:
                continue
            adv = float(r[i] - r[base[0]]) if base else 0.0
            terms.append(-adv * logp[i, first:first + count].mean())
        return torch.stack(terms).mean()

    assert_same(ours(spec, case), reference(fn, case), "remax")


@pytest.mark.parametrize("seed", SEEDS)
def test_kto(seed: int) -> None:
    """TRL KTO with the batch's own KL estimate: z0 = max(0, mean rho) detached; desirable
    (reward > 0.5) 1 - sigma(beta (rho - z0)), undesirable 1 - sigma(beta (z0 - rho)), weighted."""
    case = ragged_case(seed)
    spec = policy_spec("kto", beta=0.3, desirable_weight=1.0, undesirable_weight=1.5)
    ref = case.batch.extras["ref_logprobs"]

    def fn(logp: torch.Tensor) -> torch.Tensor:
        rows = [i for i, (_, n) in enumerate(case.rows) if n > 0]
        rho = {i: ref_seq(logp, case, i) - ref_seq(ref, case, i) for i in rows}
        z0 = max(0.0, sum(float(v.detach()) for v in rho.values()) / len(rows))
        terms = []
        for i in rows:
            if case.batch.rewards[i] > 0.5:
                terms.append(1.0 - torch.sigmoid(0.3 * (rho[i] - z0)))
            else:
                terms.append(1.5 * (1.0 - torch.sigmoid(0.3 * (z0 - rho[i]))))
        return torch.stack(terms).mean()

    assert_same(ours(spec, case), reference(fn, case), "kto")


@pytest.mark.parametrize("seed", SEEDS)
def test_simpo(seed: int) -> None:
    """TRL CPO `simpo`: logits = avg_c - avg_r - gamma / beta; loss = -log sigma(beta * logits)."""
    case = ragged_case(seed, fully_masked=False)
    spec = policy_spec("simpo", beta=2.5, gamma=0.7)

    def fn(logp: torch.Tensor) -> torch.Tensor:
        terms = []
        for c, r in ref_pairs(case):
            logits = ref_seq(logp, case, c, mean=True) - ref_seq(logp, case, r, mean=True) \
                - 0.7 / 2.5
            terms.append(-logsig(2.5 * logits))
        return torch.stack(terms).mean()

    assert_same(ours(spec, case), reference(fn, case), "simpo")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("nll_on_prompt", [True, False])
def test_orpo(seed: int, nll_on_prompt: bool) -> None:
    """TRL `ORPOTrainer.get_batch_loss_metrics`: log_odds = (a_c - a_r) - (log1mexp(a_c) -
    log1mexp(a_r)) on average logps; loss = nll - beta * mean(log sigma(log_odds)), where nll is
    `CrossEntropyLoss` (one token mean) over the chosen rows' real tokens (prompt included, as
    TRL) or, by default, over their trained tokens only. Rows are ragged, so a mean of per-row
    means would differ."""
    case = ragged_case(seed, fully_masked=False)
    spec = policy_spec("orpo", lam=0.25, nll_on_prompt=nll_on_prompt)

    def fn(logp: torch.Tensor) -> torch.Tensor:
        pairs = ref_pairs(case)
        if nll_on_prompt:  # every target position of a chosen row: all of them are real tokens
            tokens = [logp[c, :] for c, _ in pairs]
        else:
            tokens = [logp[c, case.rows[c][0]:case.rows[c][0] + case.rows[c][1]] for c, _ in pairs]
        flat = torch.cat(tokens)
        nll = -flat.sum() / flat.numel()
        ratios = []
        for c, r in pairs:
            a_c, a_r = ref_seq(logp, case, c, mean=True), ref_seq(logp, case, r, mean=True)
            odds = (a_c - a_r) - (torch.log(1 - torch.exp(a_c)) - torch.log(1 - torch.exp(a_r)))
            ratios.append(logsig(odds))
        return nll - 0.25 * torch.stack(ratios).mean()

    assert_same(ours(spec, case), reference(fn, case), "orpo")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("recipe", ["dagger", "aggrevate"])
def test_teacher_student(seed: int, recipe: str) -> None:
    """DAgger: each state's mean NLL of the teacher's label, averaged over states. AggreVaTe:
    -(Q - mean_state Q) * mean_t log pi(a), averaged over actions (unscaled advantages)."""
    case = ragged_case(seed)
    spec = policy_spec(recipe)
    adv = ref_group_advantages(case.batch.rewards, case.batch.group_index, scale=False)

    def fn(logp: torch.Tensor) -> torch.Tensor:
        terms = []
        for i, (_, count) in enumerate(case.rows):
            if count:
                weight = 1.0 if recipe == "dagger" else float(adv[i])
                terms.append(-weight * ref_seq(logp, case, i, mean=True))
        return torch.stack(terms).mean()

    assert_same(ours(spec, case), reference(fn, case), recipe)


def scores_case(seed: int) -> tuple[Case, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + seed)
    case = ragged_case(seed)
    return case, torch.randn(case.batch.num_sequences, T_WIDTH + 1, generator=gen, dtype=F64)


def value_head(spec: Any, case: Case, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from stacx.trainer.protocols import ModelOutput

    leaf = values.clone().requires_grad_(True)
    outputs = spec.extract_model_output(ModelOutput(values=leaf), case.batch)
    loss, _ = spec.compute_loss(outputs, spec.prepare_batch(case.batch))
    loss.backward()
    assert leaf.grad is not None
    return loss.detach(), leaf.grad


@pytest.mark.parametrize("seed", SEEDS)
def test_bradley_terry_reward_model(seed: int) -> None:
    """TRL RewardTrainer: -log sigma(s_c - s_r) + c (s_c + s_r)^2, score at the last real token."""
    case, values = scores_case(seed)
    spec = dataclasses.replace(get_recipe("reward_bt").roles[0].specialization, center_coef=0.05)
    last = case.batch.lengths - 1

    leaf = values.clone().requires_grad_(True)
    terms = []
    for c, r in ref_pairs(case):
        s_c, s_r = leaf[c, int(last[c])], leaf[r, int(last[r])]
        terms.append(-logsig(s_c - s_r) + 0.05 * (s_c + s_r) ** 2)
    loss = torch.stack(terms).mean()
    loss.backward()
    assert leaf.grad is not None
    assert_same(value_head(spec, case, values), (loss.detach(), leaf.grad), "reward_bt")


@pytest.mark.parametrize("seed", SEEDS)
def test_process_reward_model(seed: int) -> None:
    """PRM: one BCE per step (the last token of each masked run), label = clip(reward, 0, 1), the
    score read after the step's last token (values position t + 1 for target t)."""
    case, values = scores_case(seed)
    mask = case.batch.loss_mask.clone()
    mask[0, :] = 0.0
    mask[0, [1, 2, 5, 6, 7, 10]] = 1.0  # three steps: 1-2, 5-7, 10
    case = dataclasses.replace(case, batch=dataclasses.replace(case.batch, loss_mask=mask))
    spec = get_recipe("prm").roles[0].specialization

    leaf = values.clone().requires_grad_(True)
    terms = []
    for i in range(mask.shape[0]):
        for t in range(T_WIDTH):
            if mask[i, t] > 0 and (t + 1 == T_WIDTH or mask[i, t + 1] == 0):
                y = min(1.0, max(0.0, float(case.batch.rewards[i])))
                s = leaf[i, t + 1]
                terms.append(-(y * logsig(s) + (1 - y) * logsig(-s)))
    assert len(terms) == sum(1 for _, n in case.rows[1:] if n) + 3
    loss = torch.stack(terms).mean()
    loss.backward()
    assert leaf.grad is not None
    assert_same(value_head(spec, case, values), (loss.detach(), leaf.grad), "prm")


@pytest.mark.parametrize("seed", SEEDS)
def test_grpo_with_a_learned_reward(seed: int) -> None:
    """grpo_rm: GRPO (clip, dual clip, k3 KL) on group advantages of the reward model's scores
    plus env_weight times the environment reward."""
    case = ragged_case(seed)
    spec = policy_spec("grpo_rm", env_weight=0.5)
    scores = case.batch.extras["rm_scores"] + 0.5 * case.batch.rewards
    adv = ref_group_advantages(scores, case.batch.group_index)
    how = "seq-mean-token-mean"

    def fn(logp: torch.Tensor) -> torch.Tensor:
        pg = ref_ppo_matrix(logp, behaviour(case, logp), adv, case, 0.2, 0.2, 3.0)
        kl = ref_kl(logp, case.batch.extras["ref_logprobs"], "k3")
        return ref_aggregate(pg, case, how) + 0.04 * ref_aggregate(kl, case, how)

    assert_same(ours(spec, case), reference(fn, case), "grpo_rm")


def flow_errors(seed: int, b: int = 6, k: int = 5) -> tuple[TensorBatch, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(200 + seed)
    errors = torch.rand(b, k, generator=gen, dtype=F64) * 2
    ref = torch.rand(b, k, generator=gen, dtype=F64) * 2
    case = ragged_case(seed)
    batch = case.batch.select(torch.arange(b)).with_extras(ref_flow_error=ref)
    return batch, errors, ref


def flow_loss(spec: Any, batch: TensorBatch, errors: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = errors.clone().requires_grad_(True)
    loss, _ = spec.compute_loss({"flow_error": leaf}, spec.prepare_batch(batch))
    loss.backward()
    assert leaf.grad is not None
    return loss.detach(), leaf.grad


@pytest.mark.parametrize("seed", SEEDS)
def test_reward_weighted_flow_matching(seed: int) -> None:
    """RW-CFM: sum_i exp(r_i / tau) / sum_j exp(r_j / tau) * mean_k e_ik."""
    batch, errors, _ = flow_errors(seed)
    spec = dataclasses.replace(get_recipe("diffusion_rwfm").roles[0].specialization,
                               temperature=0.3)
    leaf = errors.clone().requires_grad_(True)
    z = sum(math.exp(float(r) / 0.3) for r in batch.rewards)
    loss = sum(math.exp(float(batch.rewards[i]) / 0.3) / z * leaf[i].mean()
               for i in range(errors.shape[0]))
    assert isinstance(loss, torch.Tensor)
    loss.backward()
    assert leaf.grad is not None
    assert_same(flow_loss(spec, batch, errors), (loss.detach(), leaf.grad), "diffusion_rwfm")


@pytest.mark.parametrize("seed", SEEDS)
def test_diffusion_dpo(seed: int) -> None:
    """Diffusion-DPO: -log sigma(-beta ((e_c - e_ref_c) - (e_r - e_ref_r))), e = mean over draws,
    pairs = best and worst reward of each group."""
    batch, errors, ref = flow_errors(seed)
    spec = dataclasses.replace(get_recipe("diffusion_dpo").roles[1].specialization, beta=2.0)
    groups = batch.group_index.tolist()
    leaf = errors.clone().requires_grad_(True)
    terms = []
    for g in sorted(set(groups)):
        idx = [i for i, x in enumerate(groups) if x == g]
        if len(idx) < 2:
            continue
        order = sorted(idx, key=lambda i: (-float(batch.rewards[i]), idx.index(i)))
        c, r = order[0], order[-1]
        gap = (leaf[c].mean() - ref[c].mean()) - (leaf[r].mean() - ref[r].mean())
        terms.append(-logsig(-2.0 * gap))
    loss = torch.stack(terms).mean()
    loss.backward()
    assert leaf.grad is not None
    assert_same(flow_loss(spec, batch, errors), (loss.detach(), leaf.grad), "diffusion_dpo")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("how", AGGREGATIONS)
def test_opd_served(seed: int, how: Aggregation) -> None:
    """OPD on the served teacher's logprobs (from the batch): sg(log s - log t) * log s."""
    case = ragged_case(seed)
    teacher = case.batch.extras["teacher_logprobs"]
    extras = {k: v for k, v in case.batch.extras.items() if k != "teacher_logprobs"}
    case = dataclasses.replace(case, batch=dataclasses.replace(
        case.batch, extras={**extras, "served_teacher_logprobs": teacher}))
    spec = policy_spec("opd_served", aggregation=how, max_tokens=BUDGET)

    def fn(logp: torch.Tensor) -> torch.Tensor:
        return ref_aggregate((logp - teacher).detach() * logp, case, how)

    assert_same(ours(spec, case), reference(fn, case), f"opd_served {how}")


def test_opd_served_without_teacher_logprobs_says_what_to_do() -> None:
    from stacx.trainer.errors import RecipeError

    with pytest.raises(RecipeError, match="teacher_logprobs"):
        policy_spec("opd_served").prepare_batch(ragged_case(0).batch)
