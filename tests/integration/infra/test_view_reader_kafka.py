"""The view's topic reader on the real broker: a page of an offset it never read answers at once
(it used to poll the broker for 5 s, holding every page of the run), a read one decodes."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from stacx.infra.view.reader import RunTopicsReader
from stacx.producers import EventProducer
from stacx.schemas.records import Trajectory


def test_an_unread_offset_is_not_found_at_once_and_a_read_one_is_fetched(
    kafka_bootstrap: str, fresh_topic: Callable[..., str]
) -> None:
    topic = fresh_topic("view-reader")
    trajectory = Trajectory(
        trajectory_id="t-0", group_id="g", sample_index=0, task_id="task", task_type="math",
        model_name="policy", policy_version=0, token_ids=np.arange(3, dtype=np.int32),
        loss_mask=np.array([0, 1, 1], np.uint8), logprobs=np.zeros(3, np.float32),
    )
    with EventProducer(EventProducer.Config(bootstrap_servers=kafka_bootstrap)) as producer:
        producer.publish(topic, trajectory, key="g").result(timeout=30)
    reader = RunTopicsReader(bootstrap_servers=kafka_bootstrap, trajectories_topic=topic, weights_topic=None,
                             timeout_s=5.0)
    try:
        reader.refresh(force=True)
        (summary,) = reader.summaries
        started = time.monotonic()
        assert reader.fetch(summary.partition, summary.offset + 99) is None
        assert reader.fetch(summary.partition + 1, 0) is None
        assert time.monotonic() - started < 0.5  # no poll of the broker for what was never read
        fetched = reader.fetch(summary.partition, summary.offset)
        assert fetched is not None and fetched.trajectory.trajectory_id == "t-0"
    finally:
        reader.close()
