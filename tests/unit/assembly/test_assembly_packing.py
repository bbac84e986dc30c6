"""pack_batch and batch_id: layout, masks, padding, determinism."""

from __future__ import annotations

import numpy as np

from stacx.consumers.assembly import PackedGroup, batch_id, pack_batch
from stacx.consumers.assembly.testing import make_trajectory


def test_pack_layout_concatenates_sequences_in_order() -> None:
    g0 = [make_trajectory("g0", 0), make_trajectory("g0", 1, num_completion=4)]
    g1 = [make_trajectory("g1", 0, task_type="code", policy_version=2)]
    batch = pack_batch(
        [PackedGroup(group_id="g0", trajectories=g0), PackedGroup(group_id="g1", trajectories=g1)],
        model_name="policy",
    )
    assert batch.trajectory_ids == [t.trajectory_id for t in g0 + g1]
    assert batch.group_ids == ["g0", "g0", "g1"]
    assert batch.task_types == ["math", "math", "code"]
    assert batch.lengths.tolist() == [5, 7, 5]
    assert batch.offsets.tolist() == [0, 5, 12]
    assert batch.prompt_lengths.tolist() == [3, 3, 3]
    assert batch.policy_versions.tolist() == [0, 0, 2]
    assert batch.rewards.tolist() == [0.0, 1.0, 0.0]
    for i, traj in enumerate(g0 + g1):
        span = slice(batch.offsets[i], batch.offsets[i] + batch.lengths[i])
        assert np.array_equal(batch.token_ids[span], traj.token_ids)
        assert np.array_equal(batch.loss_mask[span], traj.loss_mask)
        assert np.array_equal(batch.logprobs[span], traj.logprobs)
    assert batch.token_ids.dtype == np.int32 and batch.loss_mask.dtype == np.uint8
    assert batch.metadata["num_groups"] == "2"


def test_batch_id_depends_on_members_only() -> None:
    assert batch_id(["a", "b", "c"]) == batch_id(["c", "a", "b"])
    assert batch_id(["a", "b"]) != batch_id(["a", "b", "c"])
    trajs = [make_trajectory("g", i) for i in range(3)]
    first = pack_batch([PackedGroup(group_id="g", trajectories=trajs)], model_name="m")
    again = pack_batch([PackedGroup(group_id="g", trajectories=trajs)], model_name="m")
    assert first.batch_id == again.batch_id == batch_id([t.trajectory_id for t in trajs])


def test_padding_adds_masked_copies_with_the_group_mean_reward() -> None:
    trajs = [make_trajectory("g", 0, reward=1.0), make_trajectory("g", 1, reward=0.0)]
    group = PackedGroup(group_id="g", trajectories=trajs, group_size=4, pad_to=4)
    batch = pack_batch([group], model_name="m")
    assert batch.num_sequences == 4
    assert batch.trajectory_ids[2] == f"{trajs[0].trajectory_id}#pad0"
    assert batch.rewards.tolist() == [1.0, 0.0, 0.5, 0.5]
    pad_span = slice(batch.offsets[2], batch.offsets[2] + batch.lengths[2])
    assert batch.loss_mask[pad_span].sum() == 0
    assert batch.loss_mask[: batch.lengths[0]].sum() == 2
    assert batch.metadata["padded"].count("#pad") == 2
    assert batch.metadata["partial_groups"] == "g"


def test_masked_flagged_samples_keep_tokens_but_lose_the_loss_mask() -> None:
    ok, failed = make_trajectory("g", 0), make_trajectory("g", 1)
    group = PackedGroup(group_id="g", trajectories=[ok, failed],
                        flagged_ids=frozenset({failed.trajectory_id}))
    masked = pack_batch([group], model_name="m", mask_flagged=True)
    flagged = pack_batch([group], model_name="m", mask_flagged=False)
    assert masked.loss_mask[5:].sum() == 0 and masked.loss_mask[:5].sum() == 2
    assert flagged.loss_mask[5:].sum() == 2
    assert masked.metadata["flagged"] == failed.trajectory_id


def test_missing_logprobs_are_zero_filled() -> None:
    traj = make_trajectory("g", 0)
    traj.logprobs = np.zeros(0, dtype=np.float32)
    batch = pack_batch([PackedGroup(group_id="g", trajectories=[traj])], model_name="m")
    assert batch.logprobs.tolist() == [0.0] * 5
    assert batch.logprobs_recorded is not None and batch.logprobs_recorded.tolist() == [0]


def test_temperatures_and_recorded_flags_travel_per_sequence() -> None:
    hot, plain = make_trajectory("g", 0), make_trajectory("g", 1)
    hot.temperature = 0.7
    hot.logprobs = np.zeros_like(hot.logprobs)  # genuinely recorded, all 0: still recorded
    batch = pack_batch([PackedGroup(group_id="g", trajectories=[hot, plain])], model_name="m")
    assert batch.temperatures is not None and batch.logprobs_recorded is not None
    assert batch.temperatures.tolist() == [np.float32(0.7), 1.0]
    assert batch.logprobs_recorded.tolist() == [1, 1]
