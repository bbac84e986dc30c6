"""The fairness of bench/publish.py's payloads and the learning rule of bench/async.py (no broker)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

from stacx.schemas.codec import encode

BENCH = Path(__file__).resolve().parents[3] / "bench"


def _load(name: str, module_name: str) -> ModuleType:
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def test_publish_trajectories_are_distinct_with_a_multi_turn_layout() -> None:
    publish = _load("publish", "bench_publish")
    records = publish.trajectories(4, num_tokens=1000, text_chars=100)
    assert len({r.token_ids.tobytes() for r in records}) == 4  # no two share their tokens
    assert len({r.turns[0].text for r in records}) == 4
    mask, prompt = records[0].loss_mask, records[0].prompt_length
    assert prompt == 250 and not mask[:prompt].any()
    assert mask[prompt : prompt + 200].all() and not mask[prompt + 200 : prompt + 400].any()
    for r in records:
        assert (r.logprobs[mask == 0] == 0).all() and (r.logprobs[mask == 1] < 0).all()


def test_the_tool_gets_the_same_records_as_7_bit_lines(tmp_path: Path) -> None:
    publish = _load("publish", "bench_publish")
    payloads = [encode(r) for r in publish.trajectories(3, num_tokens=500, text_chars=50)]
    path = tmp_path / "payloads"
    publish.write_payload_file(path, payloads)
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 4
    for line, payload in zip(lines, payloads, strict=False):
        assert len(line) == len(payload) and max(line) < 0x80
        assert line.decode("utf-8").encode("utf-8") == line  # what the Java tool sends, byte for byte
        kept = np.frombuffer(payload, np.uint8) & 0x7F
        assert (np.frombuffer(line, np.uint8)[kept != 0x0A] == kept[kept != 0x0A]).all()


def test_grpo_step_moves_the_policy_towards_the_rewarded_answer() -> None:
    bench = _load("async", "bench_async")
    w = bench.Workload(tasks=1, actions=4, group_size=4, prompts=1, turns=0, lr=1.0, train_s=0.0,
                       max_staleness=1, budget_s=0.0, seed=0)  # fmt: skip
    policy = bench.Policy(np.zeros((1, 4)))
    log_p = float(np.log(0.25))
    group = [bench.Sample(0, a, log_p, float(a == 2), 0) for a in range(4)]
    trained = bench.train_step(policy, [group], w)
    assert trained.version == 1 and np.argmax(trained.logits[0]) == 2
    assert trained.success(np.array([2])) > policy.success(np.array([2])) == 0.25
    # a sample whose ratio is already above 1 + clip gets no further push
    stale = bench.Policy(np.array([[0.0, 0.0, 5.0, 0.0]]))
    assert np.allclose(bench.train_step(stale, [group], w).logits[0, 2], 5.0)
