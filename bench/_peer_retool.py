"""The peer side of `bench/peer_trl.py`: ReTool episodes in plain transformers and TRL's GRPOTrainer.

This file runs in two interpreters and so imports nothing of STACX:
- in our venv, `evaluate_checkpoint` scores every wall-clock checkpoint of both systems on the
  same held-out problems with the same sampler and seed (the measuring instrument;
  `python bench/_peer_retool.py score JOB.json` is one of the processes scoring in parallel);
- in TRL's own venv, `python bench/_peer_retool.py trl SETTINGS.json` trains with
  `trl.GRPOTrainer` and writes one JSON result.

TRL's built-in tool loop parses JSON tool calls through the chat template's response schema and
renders results as `tool` messages; the quickstart's policy was fine-tuned on the ReTool format
(`<tool_call>print(..)</tool_call>` then an inline `<tool_response>`), so the TRL side plugs the
same episode into GRPOTrainer's `rollout_func` hook (generation with transformers `generate`, as
TRL does without vLLM; tool output tokens get `env_mask` 0, like loss mask 0 in STACX).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
TASK_FILE = REPO_ROOT / "examples" / "quickstart" / "arithmetic.py"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_CALL_OPEN = "<tool_call>"


def load_task(path: Path = TASK_FILE) -> ModuleType:
    """A quickstart task module (problems, reward, tool-response format) by file; its package's
    folder (examples/) goes on sys.path so that it can import its sibling `quickstart.arithmetic`."""
    name = f"_peer_task_{Path(path).stem}"
    if name in sys.modules:
        return sys.modules[name]
    folder = str(Path(path).resolve().parents[1])
    if folder not in sys.path:
        sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- the tool


@dataclass(kw_only=True, slots=True)
class ToolLatency:
    """Delay added to every tool call, before the code runs: `min(cap_s, scale_s * Pareto(alpha))`
    (`model="pareto"`), or a value of a recorded sample of real sandbox exec times
    (`model="recorded"`, `samples_s`). The draw is seeded by `seed` and the call's code, so both
    systems see the same delay for the same call."""

    scale_s: float = 0.0
    """Pareto scale (the minimum delay); 0 disables the Pareto delay."""
    alpha: float = 1.5
    """Pareto shape: mean `scale_s * alpha / (alpha - 1)`, infinite variance below 2."""
    cap_s: float = 10.0
    """Upper bound (below the sandbox step timeout)."""
    model: str = "pareto"
    """`pareto` or `recorded`."""
    samples_s: list[float] = field(default_factory=list)
    """The recorded sample (`recorded`): one value drawn per call."""
    seed: int = 0

    def enabled(self) -> bool:
        return bool(self.samples_s) if self.model == "recorded" else self.scale_s > 0

    def python_command(self) -> str:
        """The interpreter command both systems run as `<command> -` with the code on stdin
        (inside double quotes in bash: no `"`, `$` or backquote in it)."""
        if not self.enabled():
            return "python3"
        if self.model == "recorded":
            values = ",".join(str(round(x * 1000)) for x in self.samples_s)
            delay = f"min({self.cap_s!r},r.choice(({values},))/1000)"
        else:
            delay = f"min({self.cap_s!r},{self.scale_s!r}*r.paretovariate({self.alpha!r}))"
        code = (
            "import random,sys,time;c=sys.stdin.read();"
            f"r=random.Random(str({self.seed!r})+c.strip());time.sleep({delay});"
            "exec(compile(c,'<tool>','exec'))"
        )
        return f'python3 -c "{code}"'

    def describe(self) -> dict[str, Any]:
        if self.model == "recorded":
            import statistics

            return {
                "distribution": "a value of the recorded sandbox exec-time sample per call",
                "samples": len(self.samples_s),
                "median_s": round(statistics.median(self.samples_s), 4) if self.samples_s else None,
                "mean_s": round(statistics.fmean(self.samples_s), 4) if self.samples_s else None,
                "cap_s": self.cap_s,
                "seed": self.seed,
            }
        return {"distribution": "min(cap, scale * Pareto(alpha)) per call", "scale_s": self.scale_s,
                "alpha": self.alpha, "cap_s": self.cap_s, "seed": self.seed}


def run_tool(python: str, code: str, *, timeout_s: float = 30.0) -> str:
    """Run `code` as the ReTool scaffold does (`bash -c '<python> -'`, stdin = code); stdout+stderr.

    The peer has no sandbox: the code runs as a plain child process."""
    try:
        done = subprocess.run(
            ["bash", "-c", f"{python} -"],
            input=code.strip("\n") + "\n",
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return "\n[timed out]"
    return (done.stdout + done.stderr)[:2000]


_PRINTED_SUM = re.compile(r"\s*print\(([0-9+\-*() ]{1,120})\)\s*")


def inline_arithmetic(code: str) -> str | None:
    """What `python3 -` prints for `print(<integer + - * expression>)`, computed here (None for any
    other code): the scorer's shortcut, exact for the calls it takes, a process for the rest."""
    match = _PRINTED_SUM.fullmatch(code)
    if not match or "**" in match.group(1):
        return None
    try:
        tree = ast.parse(match.group(1), mode="eval")
    except SyntaxError:
        return None
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Add, ast.Sub, ast.Mult, ast.USub, ast.UAdd)
    for node in ast.walk(tree):
        if not (isinstance(node, allowed) or (isinstance(node, ast.Constant) and type(node.value) is int)):
            return None
    if any(isinstance(n, ast.Constant) and len(str(n.value)) > 1 and str(n.value)[0] == "0"
           for n in ast.walk(tree)):  # python3 rejects leading zeros: let it say so
        return None
    return f"{eval(compile(tree, '<tool>', 'eval'))}\n"  # noqa: S307 (checked: integer + - * only)


# ----------------------------------------------------------------------------- episodes


@dataclass(kw_only=True, slots=True)
class SamplingConfig:
    """The quickstart evaluator's limits (examples/quickstart.yaml `arithmetic_tool`)."""

    temperature: float = 1.0
    max_new_tokens: int = 48
    """Tokens per generation turn."""
    max_turns: int = 3
    max_tokens: int = 256
    """Whole sequence: prompt + generated + tool output."""


@dataclass(kw_only=True, slots=True)
class Episode:
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    """1: generated by the policy, 0: tool output."""
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    tool_calls: int = 0


class BudgetSpent(Exception):
    """The wall-clock budget ran out while a batch of episodes was being sampled."""


class EpisodeSampler:
    """Batched ReTool episodes: generate until `</tool_call>` or end of turn, run the tool calls of
    a turn concurrently, splice the `<tool_response>` in, generate again."""

    deadline: float | None = None
    """Epoch seconds after which `sample` raises BudgetSpent at its next turn (None: never)."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        python: str,
        sampling: SamplingConfig,
        tool_workers: int = 64,
        task_file: Path = TASK_FILE,
        inline_tools: bool = False,
    ) -> None:
        """`inline_tools`: answer plain arithmetic calls in this process (`inline_arithmetic`;
        the scorer only: the racing sides run every call as a process)."""
        self.inline_tools = inline_tools
        self.tok = tokenizer
        self.python = python
        self.sampling = sampling
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.tool_close = tokenizer.convert_tokens_to_ids(TOOL_CALL_CLOSE)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos
        self.pool = ThreadPoolExecutor(tool_workers, thread_name_prefix="peer-tool")
        self.task = load_task(task_file)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def prompt_ids(self, prompt: str) -> list[int]:
        text = self.tok.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return self.encode(text)

    def sample(self, model: Any, prompts: list[str]) -> list[Episode]:
        import torch

        episodes = [Episode(prompt_ids=self.prompt_ids(p)) for p in prompts]
        live = list(episodes)
        with torch.no_grad():
            for turn in range(self.sampling.max_turns):
                if not live:
                    break
                if self.deadline is not None and time.time() >= self.deadline:
                    raise BudgetSpent
                calls = self._turn(model, live, last=turn == self.sampling.max_turns - 1)
                self._run_tools(calls)
                live = calls
        for e in episodes:
            e.text = self.tok.decode(e.completion_ids, skip_special_tokens=False)
        return episodes

    def _turn(self, model: Any, live: list[Episode], *, last: bool) -> list[Episode]:
        """One generation round; returns the episodes that stopped on `</tool_call>`."""
        budget = [self.sampling.max_tokens - len(e.prompt_ids) - len(e.completion_ids) for e in live]
        rows = self._generate(model, [e.prompt_ids + e.completion_ids for e in live], max(budget))
        calls = []
        for e, (ids, lps), left in zip(live, rows, budget, strict=True):
            ids, lps = ids[: min(left, self.sampling.max_new_tokens)], lps[: len(ids)]
            e.completion_ids += ids
            e.env_mask += [1] * len(ids)
            e.logprobs += lps
            if ids and ids[-1] == self.tool_close and not last and len(ids) < left:
                calls.append(e)
        return calls

    def _generate(
        self, model: Any, inputs: list[list[int]], budget: int
    ) -> list[tuple[list[int], list[float]]]:
        import torch

        width = max(len(x) for x in inputs)
        ids = torch.tensor([[self.pad] * (width - len(x)) + x for x in inputs])
        attn = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in inputs])
        out = model.generate(
            input_ids=ids,
            attention_mask=attn,
            do_sample=True,
            temperature=self.sampling.temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max(1, min(budget, self.sampling.max_new_tokens)),
            eos_token_id=[self.eos, self.tool_close],
            pad_token_id=self.pad,
            return_dict_in_generate=True,
            output_scores=True,
        )
        new = out.sequences[:, width:]  # [B, T]
        logps = torch.stack(out.scores, 1).float().log_softmax(-1)  # [B, T, V]
        picked = logps.gather(-1, new.unsqueeze(-1)).squeeze(-1)  # [B, T]
        rows = []
        for row, lp in zip(new.tolist(), picked.tolist(), strict=True):
            end = next((i + 1 for i, t in enumerate(row) if t in (self.eos, self.tool_close)), len(row))
            rows.append((row[:end], lp[:end]))
        return rows

    def _run_tools(self, calls: list[Episode]) -> None:
        codes = []
        for e in calls:
            e.tool_calls += 1
            text = self.tok.decode(e.completion_ids, skip_special_tokens=False)
            codes.append(
                text[text.rfind(TOOL_CALL_OPEN) + len(TOOL_CALL_OPEN) :].split(TOOL_CALL_CLOSE, 1)[0]
            )
        def tool(code: str) -> str:
            inline = inline_arithmetic(code.strip("\n")) if self.inline_tools else None
            return inline if inline is not None else run_tool(self.python, code)

        outputs = list(self.pool.map(tool, codes))
        for e, output in zip(calls, outputs, strict=True):
            obs = self.encode(self.task.tool_response_text(output))
            e.completion_ids += obs
            e.env_mask += [0] * len(obs)
            e.logprobs += [0.0] * len(obs)


# ----------------------------------------------------------------------------- evaluation


EVAL_CHUNK = 64
"""Held-out problems sampled together: `generate` steps every row of a batch until its last one
stops, so smaller batches waste fewer steps (all 512 problems at once: 8.4 s a checkpoint on 2
threads; chunks of 64: 5.2 s)."""


def evaluate_checkpoint(
    model_dir: str,
    tokenizer_dir: str,
    problems: list[Any],
    *,
    sampling: SamplingConfig,
    seed: int,
    threads: int,
    task_file: Path = TASK_FILE,
    chunk: int = EVAL_CHUNK,
) -> dict[str, float]:
    """Held-out success and tool-use rate of one checkpoint, one sample per problem (sampled
    `chunk` problems at a time, the seed set once)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    sampler = EpisodeSampler(
        AutoTokenizer.from_pretrained(tokenizer_dir),
        python="python3",
        sampling=sampling,
        task_file=task_file,
        inline_tools=True,
    )
    torch.manual_seed(seed)
    prompts = [p.prompt for p in problems]
    episodes = []
    for start in range(0, len(prompts), chunk):
        episodes += sampler.sample(model, prompts[start : start + chunk])
    task = sampler.task
    rewards = [task.reward(e.text, p.answer) for e, p in zip(episodes, problems, strict=True)]
    return {
        "success": sum(rewards) / len(rewards),
        "tool_rate": sum(e.tool_calls > 0 for e in episodes) / len(episodes),
        "two_calls_rate": sum(e.tool_calls > 1 for e in episodes) / len(episodes),
    }


@dataclass(kw_only=True, slots=True)
class ScoreJob:
    """The checkpoints one scoring process takes (written by peer_trl.py as JSON)."""

    model_dirs: list[str]
    tokenizer_dir: str
    task_file: str
    num_heldout: int
    problems_seed: int
    sampling: dict[str, Any]
    seed: int
    threads: int
    out: str
    """Where the scores go: JSON, model dir to `evaluate_checkpoint`'s figures."""


def score_job(job: ScoreJob) -> dict[str, dict[str, float]]:
    task_file = Path(job.task_file)
    problems = load_task(task_file).make_problems(job.num_heldout, seed=job.problems_seed)
    sampling = SamplingConfig(**job.sampling)
    return {
        model_dir: evaluate_checkpoint(model_dir, job.tokenizer_dir, problems, sampling=sampling,
                                       seed=job.seed, threads=job.threads, task_file=task_file)
        for model_dir in job.model_dirs
    }


# ----------------------------------------------------------------------------- the TRL side


@dataclass(kw_only=True, slots=True)
class TrlSettings:
    """Everything the TRL worker needs (written by peer_trl.py as JSON)."""

    sft_dir: str
    out_dir: str
    started_at: float
    """Epoch seconds when the parent launched this worker (t = 0 of the budget)."""
    budget_s: float
    python: str
    """Tool interpreter command (with the latency wrapper when enabled)."""
    threads: int
    num_train: int
    heldout_seed: int
    num_heldout: int
    task_seed: int
    group_size: int
    prompts_per_step: int
    lr: float
    kl_beta: float
    clip_low: float
    clip_high: float
    max_grad_norm: float
    seed: int
    sampling: dict[str, Any]
    task_file: str = str(TASK_FILE)


def _train_dataset(s: TrlSettings) -> Any:
    from datasets import Dataset

    task = load_task(Path(s.task_file))
    heldout = task.make_problems(s.num_heldout, seed=s.heldout_seed)
    exclude = frozenset(p.expression for p in heldout)
    train = task.make_problems(s.num_train, seed=s.task_seed, exclude=exclude)
    return Dataset.from_list([{"prompt": p.prompt, "answer": str(p.answer)} for p in train])


def _grpo_config(s: TrlSettings) -> Any:
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(Path(s.out_dir) / "trl-output"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        learning_rate=s.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=s.max_grad_norm,
        per_device_train_batch_size=s.group_size * s.prompts_per_step,
        gradient_accumulation_steps=1,
        num_generations=s.group_size,
        num_iterations=1,
        max_completion_length=int(s.sampling["max_tokens"]),
        temperature=float(s.sampling["temperature"]),
        beta=s.kl_beta,
        epsilon=s.clip_low,
        epsilon_high=s.clip_high,
        loss_type="grpo",
        scale_rewards="group",
        mask_truncated_completions=False,
        max_steps=1_000_000,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        seed=s.seed,
        dataloader_num_workers=0,
    )


def run_trl(s: TrlSettings) -> dict[str, Any]:
    """GRPO with trl.GRPOTrainer until the wall-clock budget is spent; a checkpoint per step."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    torch.set_num_threads(s.threads)
    task = load_task(Path(s.task_file))
    tokenizer = AutoTokenizer.from_pretrained(s.sft_dir)
    model = AutoModelForCausalLM.from_pretrained(s.sft_dir, dtype=torch.float32)
    sampler = EpisodeSampler(
        tokenizer, python=s.python, sampling=SamplingConfig(**s.sampling), task_file=Path(s.task_file)
    )
    sampler.deadline = s.started_at + s.budget_s  # a step that would end after it is not waited for
    stats: dict[str, Any] = {
        "trajectories": 0,
        "tool_calls": 0,
        "generate_s": 0.0,
        "step_s": 0.0,
        "tokens": 0,
    }
    versions: list[dict[str, Any]] = []
    out = Path(s.out_dir)

    def rollout_func(prompts: list[str], trainer: Any) -> dict[str, Any]:
        was_training = trainer.model.training
        trainer.model.eval()
        episodes = sampler.sample(trainer.model, list(prompts))
        trainer.model.train(was_training)
        stats["trajectories"] += len(episodes)
        stats["tool_calls"] += sum(e.tool_calls > 0 for e in episodes)
        return {
            "prompt_ids": [e.prompt_ids for e in episodes],
            "completion_ids": [e.completion_ids for e in episodes],
            "logprobs": [e.logprobs for e in episodes],
            "env_mask": [e.env_mask for e in episodes],
            "episode_text": [e.text for e in episodes],
        }

    def exact_answer(
        completions: list[Any], answer: list[str], episode_text: list[str], **_: Any
    ) -> list[float]:
        return [task.reward(text, a) for text, a in zip(episode_text, answer, strict=True)]

    class Timed(GRPOTrainer):  # type: ignore[misc, valid-type]
        def _generate_and_score_completions(self, inputs: Any) -> Any:
            t0 = time.monotonic()
            output = super()._generate_and_score_completions(inputs)
            stats["generate_s"] += time.monotonic() - t0
            stats["tokens"] += int(output["prompt_mask"].sum() + output["completion_mask"].sum())
            return output

    class WallClock(TrainerCallback):  # type: ignore[misc]
        step_started = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.step_started = time.monotonic()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            stats["step_s"] += time.monotonic() - self.step_started
            path = out / "weights" / f"v{state.global_step}"
            kw["model"].save_pretrained(path)
            versions.append(
                {
                    "version": state.global_step,
                    "at": time.time(),
                    "path": str(path),
                    "trajectories": stats["trajectories"],
                    "tokens": stats["tokens"],
                    "busy_s": stats["step_s"] - stats["generate_s"],
                }
            )
            if time.time() - s.started_at >= s.budget_s:
                control.should_training_stop = True

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    trainer = Timed(
        model=model,
        reward_funcs=exact_answer,
        args=_grpo_config(s),
        train_dataset=_train_dataset(s),
        processing_class=tokenizer,
        rollout_func=rollout_func,
        callbacks=[WallClock()],
    )
    ready_at = time.time()
    with contextlib.suppress(BudgetSpent):
        trainer.train()
    return {
        "versions": versions,
        "ready_at": ready_at,
        "ended_at": time.time(),
        **stats,
        "settings": asdict(s),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["trl", "score"])
    parser.add_argument("settings", help="TrlSettings or ScoreJob as JSON (written by bench/peer_trl.py)")
    args = parser.parse_args(argv)
    if args.mode == "score":
        job = ScoreJob(**json.loads(Path(args.settings).read_text()))
        Path(job.out).write_text(json.dumps(score_job(job)))
        return 0
    settings = TrlSettings(**json.loads(Path(args.settings).read_text()))
    result = run_trl(settings)
    (Path(settings.out_dir) / "result.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.path[0] = str(REPO_ROOT / "examples")  # not bench/: its rollout.py, trainer.py would shadow packages
    sys.exit(main())
