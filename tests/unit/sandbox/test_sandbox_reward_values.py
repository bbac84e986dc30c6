"""reward.json and reward.txt values: booleans (1/0, as Harbor), non-finite numbers, the scalar reward."""

from __future__ import annotations

import pytest

from stacx.sandbox.errors import RewardFileEmpty, RewardFileMalformed
from stacx.sandbox.verifier import (
    REWARD_JSON,
    REWARD_TXT,
    parse_reward_json,
    parse_reward_text,
    scalar_reward,
)


@pytest.mark.parametrize(("text", "rewards"), [(b'{"reward": 1, "ok": true}', {"reward": 1.0, "ok": 1.0}),
                                              (b'{"reward": false}', {"reward": 0.0}),
                                              (b'{"reward": true}', {"reward": 1.0})])
def test_reward_json_booleans_are_one_and_zero_as_harbor_reads_them(text: bytes, rewards: dict) -> None:
    # Harbor's verifier accepts a JSON boolean (a Python int) and its result model makes it 1.0 / 0.0
    assert parse_reward_json(text) == rewards


def test_reward_json_names_the_bad_keys_and_the_file() -> None:
    with pytest.raises(RewardFileMalformed) as info:
        parse_reward_json(b'{"reward": 1, "ok": null, "style": "good"}', where="task/reward.json")
    assert str(info.value) == "task/reward.json: values of ['ok', 'style'] are not numbers"
    with pytest.raises(RewardFileMalformed, match=r"^/logs/verifier/reward.json: values must be finite"):
        parse_reward_json(b'{"reward": -Infinity}')
    with pytest.raises(RewardFileMalformed, match="non-empty JSON object"):
        parse_reward_json(b"{}")
    with pytest.raises(RewardFileEmpty, match=f"^{REWARD_JSON} is empty"):
        parse_reward_json(b" \n")


def test_reward_json_values_become_floats_with_string_keys() -> None:
    rewards = parse_reward_json(b'\n {"reward": 1, "style": 0.25, "len": -2} \n')
    assert rewards == {"reward": 1.0, "style": 0.25, "len": -2.0}
    assert all(type(v) is float for v in rewards.values())


def test_reward_text_errors_name_the_file() -> None:
    with pytest.raises(RewardFileEmpty, match=f"^{REWARD_TXT} is empty"):
        parse_reward_text(b"")
    with pytest.raises(RewardFileMalformed, match="^r.txt must hold a finite number"):
        parse_reward_text(b"inf", where="r.txt")
    with pytest.raises(RewardFileMalformed, match="^r.txt must hold one number, got 'x'"):
        parse_reward_text(b"x\n", where="r.txt")
    assert parse_reward_text(b"\xff-1.5\n".replace(b"\xff", b"")) == -1.5


def test_scalar_reward_prefers_reward_else_the_mean() -> None:
    assert scalar_reward({"reward": 0.0, "style": 1.0}) == 0.0
    assert scalar_reward({"a": 1.0, "b": 0.0, "c": 0.5}) == 0.5
    assert scalar_reward({"only": -2.0}) == -2.0
