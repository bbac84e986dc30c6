"""Plain PyTorch + transformers prototype of the quickstart's learning dynamics.

No Kafka, no sandbox, no STACX: a tiny Qwen2 from scratch, a character-level tokenizer, SFT on the
mixed demonstrations of `arithmetic.py`, then on-policy GRPO with reward 1 for a correct answer.
The tool runs in-process (a restricted arithmetic evaluator, prototype only). Used to choose the
quickstart's model size and hyper-parameters; the figures are in docs/quickstart.md.

    .venv/bin/python examples/quickstart/prototype.py --json
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import arithmetic as ar  # noqa: E402


class FactoryTokenizer:
    """The factory's byte-level tokenizer (digits are single tokens) with its ChatML template."""

    def __init__(self) -> None:
        from rollout.models import make_tokenizer

        self.inner = make_tokenizer()
        self.pad = self.inner.pad_token_id
        self.eos = self.inner.convert_tokens_to_ids("<|im_end|>")
        self.tool_close = self.inner.convert_tokens_to_ids(ar.TOOL_CALL_CLOSE)

    def encode(self, text: str) -> list[int]:
        return list(self.inner.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self.inner.decode(ids, skip_special_tokens=True))

    def prompt(self, problem: ar.Problem) -> list[int]:
        text = self.inner.apply_chat_template([{"role": "user", "content": problem.prompt}],
                                              tokenize=False, add_generation_prompt=True)
        return self.encode(text)


@dataclass(kw_only=True)
class Settings:
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    sft_steps: int = 400
    sft_batch: int = 64
    sft_lr: float = 2e-3
    tool_fraction: float = 0.3
    mental_accuracy: float = 0.5
    skill_steps: int = 0
    skill_tool_fraction: float = 0.9
    grpo_steps: int = 30
    prompts_per_step: int = 8
    group_size: int = 8
    grpo_lr: float = 5e-4
    temperature: float = 1.0
    max_new_tokens: int = 40
    eval_problems: int = 200
    eval_every: int = 5
    loss_norm: str = "token"  # "token": mean over all loss tokens; "seq": per-sequence mean
    seed: int = 0
    threads: int = 2
    save_sft: str = ""
    load_sft: str = ""
    sft_eval_every: int = 0


def build_model(s: Settings) -> torch.nn.Module:
    """A model from the factory (`rollout.models.make_tiny_model`), loaded like the server does."""
    import tempfile

    from transformers import AutoModelForCausalLM

    from rollout.models import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        make_tiny_model(tmp, hidden_size=s.hidden, intermediate_size=4 * s.hidden,
                        num_hidden_layers=s.layers, num_attention_heads=s.heads,
                        num_key_value_heads=s.kv_heads, seed=s.seed)
        return AutoModelForCausalLM.from_pretrained(tmp)


def sft_example(tok: FactoryTokenizer, problem: ar.Problem, rng: random.Random,
                demo: ar.DemonstrationConfig) -> tuple[list[int], list[int]]:
    ids = tok.prompt(problem)
    mask = [0] * len(ids)
    for i, seg in enumerate(ar.demonstration(problem, rng, demo, end="<|im_end|>")):
        seg_ids = tok.encode(seg)
        ids += seg_ids
        mask += [0 if i % 2 else 1] * len(seg_ids)
    return ids, mask


def pad_batch(seqs: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [value] * (width - len(s)) for s in seqs])


def token_logprobs(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """[B, T-1] logprob of token t+1 given the prefix."""
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def run_tool(code: str) -> str:
    """Prototype-only stand-in for the sandbox: `print(<integer arithmetic>)`."""
    m = re.fullmatch(r"print\(([0-9+\-*() ]{1,40})\)", code.strip())
    if not m:
        return "SyntaxError"
    try:
        return str(eval(m.group(1), {"__builtins__": {}}))  # noqa: S307 - digits/operators only
    except Exception as exc:  # untrusted model output: report, never crash
        return type(exc).__name__


@dataclass
class Episode:
    ids: list[int]
    mask: list[int]
    prompt_len: int
    text: str = ""
    done: bool = False
    tool_calls: int = 0


@torch.no_grad()
def rollout(model: torch.nn.Module, tok: FactoryTokenizer, problems: list[ar.Problem], s: Settings,
            temperature: float) -> list[Episode]:
    """Batched multi-turn sampling; the tool response is spliced in after `</tool_call>`."""
    eps = [Episode(ids=tok.prompt(p), mask=[], prompt_len=0) for p in problems]
    for e in eps:
        e.prompt_len = len(e.ids)
        e.mask = [0] * e.prompt_len
    close_id = tok.tool_close
    for _ in range(s.max_new_tokens):
        live = [e for e in eps if not e.done]
        if not live:
            break
        ids = pad_batch([e.ids for e in live], tok.pad)
        lens = torch.tensor([len(e.ids) for e in live])
        attn = (torch.arange(ids.shape[1])[None] < lens[:, None]).long()
        logits = model(input_ids=ids, attention_mask=attn).logits
        last = logits[torch.arange(len(live)), lens - 1].float()
        if temperature > 0:
            nxt = torch.multinomial(torch.softmax(last / temperature, -1), 1).squeeze(-1)
        else:
            nxt = last.argmax(-1)
        for e, t in zip(live, nxt.tolist(), strict=True):
            e.ids.append(t)
            e.mask.append(1)
            if t == tok.eos or len(e.ids) - e.prompt_len >= s.max_new_tokens + 12:
                e.done = True
            elif t == close_id:
                e.tool_calls += 1
                text = tok.decode(e.ids[e.prompt_len:])
                code = ar.extract_tool_code(ar.TOOL_CALL_OPEN + text.rsplit(ar.TOOL_CALL_OPEN, 1)[-1]) or ""
                obs = tok.encode(ar.tool_response_text(run_tool(code) + "\n"))
                e.ids += obs
                e.mask += [0] * len(obs)
                if e.tool_calls > 2:
                    e.done = True
    for e in eps:
        e.text = tok.decode(e.ids[e.prompt_len:])
    return eps


def evaluate(model, tok, problems, s, temperature=1.0) -> dict[str, float]:
    model.eval()
    eps = rollout(model, tok, problems, s, temperature)
    rewards = [ar.reward(e.text, p.answer) for e, p in zip(eps, problems, strict=True)]
    tools = [ar.used_tool(e.text) for e in eps]
    model.train()
    tool_ok = [r for r, t in zip(rewards, tools, strict=True) if t]
    return {"success": sum(rewards) / len(rewards), "tool_rate": sum(tools) / len(tools),
            "tool_success": round(sum(tool_ok) / max(1, len(tool_ok)), 3)}


def sft(model, tok, s: Settings, heldout: list, log) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=s.sft_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / 20))  # warmup then constant, as the trainer does
    rng = random.Random(s.seed + 1)
    mixture = ar.DemonstrationConfig(tool_fraction=s.tool_fraction,
                                     mental_accuracy=s.mental_accuracy)
    skill = ar.DemonstrationConfig(tool_fraction=s.skill_tool_fraction,
                                   mental_accuracy=s.mental_accuracy)
    for step in range(s.sft_steps):
        demo = skill if step < s.skill_steps else mixture
        batch = [sft_example(tok, p, rng, demo) for p in
                 (ar.sample_problem(rng) for _ in range(s.sft_batch)) if p not in heldout]
        ids = pad_batch([b[0] for b in batch], tok.pad)
        mask = pad_batch([b[1] for b in batch], 0)[:, 1:].float()
        attn = (ids != tok.pad).long()
        lp = token_logprobs(model, ids, attn)
        loss = -(lp * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == s.sft_steps - 1:
            log(f"sft {step} loss {loss.item():.4f}")
        if s.sft_eval_every and (step + 1) % s.sft_eval_every == 0:
            log(f"sft {step + 1} eval {evaluate(model, tok, heldout[:64], s)}")


def grpo_step(model, opt, tok, problems, s: Settings) -> dict[str, float]:
    group = [p for p in problems for _ in range(s.group_size)]
    model.eval()
    eps = rollout(model, tok, group, s, s.temperature)
    model.train()
    r = torch.tensor([ar.reward(e.text, p.answer) for e, p in zip(eps, group, strict=True)])
    rg = r.view(-1, s.group_size)
    adv = ((rg - rg.mean(1, keepdim=True)) / (rg.std(1, keepdim=True) + 1e-4)).view(-1)
    ids = pad_batch([e.ids for e in eps], tok.pad)
    mask = pad_batch([e.mask for e in eps], 0)[:, 1:].float()
    lens = torch.tensor([len(e.ids) for e in eps])
    attn = (torch.arange(ids.shape[1])[None] < lens[:, None]).long()
    lp = token_logprobs(model, ids, attn)
    per_tok = -adv[:, None] * lp * mask
    if s.loss_norm == "token":
        loss = per_tok.sum() / mask.sum().clamp(min=1)
    else:
        loss = (per_tok.sum(1) / mask.sum(1).clamp(min=1)).mean()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return {"reward": r.mean().item(), "tool_rate": sum(ar.used_tool(e.text) for e in eps) / len(eps)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    for name, value in asdict(Settings()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    s = Settings(**{k: getattr(args, k) for k in asdict(Settings())})
    torch.set_num_threads(s.threads)
    random.seed(s.seed)
    torch.manual_seed(s.seed)
    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f}s] {msg}", file=sys.stderr, flush=True)

    tok = FactoryTokenizer()
    model = build_model(s)
    log(f"params {sum(p.numel() for p in model.parameters()) / 1e6:.3f}M")
    heldout = ar.make_problems(s.eval_problems, seed=10_000 + s.seed)
    held = frozenset(p.expression for p in heldout)
    if s.load_sft:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(s.load_sft)
    if s.sft_steps > 0:
        sft(model, tok, s, heldout, log)
    if s.save_sft:
        model.save_pretrained(s.save_sft)
    t_sft = time.monotonic() - t0
    before = evaluate(model, tok, heldout, s)
    greedy_before = evaluate(model, tok, heldout, s, temperature=0.0)
    log(f"after SFT: {before} greedy {greedy_before}")
    opt = torch.optim.AdamW(model.parameters(), lr=s.grpo_lr, weight_decay=0.0)
    rng = random.Random(s.seed + 2)
    curve = []
    for step in range(1, s.grpo_steps + 1):
        probs = [p for p in (ar.sample_problem(rng) for _ in range(s.prompts_per_step * 2))
                 if p.expression not in held][: s.prompts_per_step]
        m = grpo_step(model, opt, tok, probs, s)
        point = {"step": step, **m}
        if step % s.eval_every == 0 or step == s.grpo_steps:
            point["heldout"] = evaluate(model, tok, heldout, s)["success"]
        curve.append(point)
        log(json.dumps(point))
    after = evaluate(model, tok, heldout, s)
    greedy_after = evaluate(model, tok, heldout, s, temperature=0.0)
    result = {"settings": asdict(s), "sft_s": round(t_sft, 1), "wall_s": round(time.monotonic() - t0, 1),
              "success_before": before["success"], "tool_rate_before": before["tool_rate"],
              "success_after": after["success"], "tool_rate_after": after["tool_rate"],
              "greedy_before": greedy_before["success"], "greedy_after": greedy_after["success"],
              "curve": curve}
    log(f"after GRPO: {after} greedy {greedy_after}")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
