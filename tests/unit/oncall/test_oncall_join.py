"""The delayed-feedback join: window, late feedback to the DLQ, unrewarded sessions counted."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP
from oncall_fixtures import call, rating

from stacx.consumers.assembly.errors import AssemblyError
from stacx.consumers.assembly.testing import ListForwarder, RecordsReader, kafka_record, on_topic
from stacx.consumers.oncall import FeedbackJoin, Joined, OncallJoinApp, Rejected
from stacx.consumers.oncall.app import ONCALL_TICK_KEY
from stacx.consumers.oncall.clock import EventClock
from stacx.consumers.oncall.join import SessionState, feedback_id
from stacx.schemas.codec import decode, encode
from stacx.schemas.records import DeadLetter, Trajectory

WINDOW_S = 60.0
T0 = 1_000_000


def _join(**config: object) -> FeedbackJoin:
    return FeedbackJoin(FeedbackJoin.Config(window_s=WINDOW_S, **config), {})  # type: ignore[arg-type]


def test_feedback_within_the_window_rewards_and_closes_the_trajectory() -> None:
    join = _join()
    join.on_interaction(call("s", "c1", [1, 2], [3], at_ms=T0))
    join.on_interaction(call("s", "c2", [1, 2, 3, 4], [5], at_ms=T0 + 1000))
    (joined,) = join.on_feedback(rating("s", 1.0, at_ms=T0 + 30_000), "f1")
    assert isinstance(joined, Joined)
    t = joined.trajectory
    assert t.reward == 1.0 and t.rewards == {"user": 1.0}
    assert t.metadata["interaction_ids"] == "c1,c2" and t.metadata["feedback_ids"] == "f1"
    assert list(t.token_ids) == [1, 2, 3, 4, 5] and list(t.loss_mask) == [0, 0, 1, 0, 1]
    assert join.stats.feedback_joined == 1 and join.stats.trajectories_rewarded == 1
    # the next call of the session starts a new trajectory
    join.on_interaction(call("s", "c3", [1, 2, 3, 4, 5, 6], [7], at_ms=T0 + 40_000))
    assert join.stats.new_trajectory_reasons["after_feedback"] == 1
    assert join.on_tick(T0 + 40_000 + 61_000) == [] and join.stats.unrewarded_dropped == 1


def test_feedback_after_the_window_goes_to_the_dlq_as_late() -> None:
    join = _join()
    join.on_interaction(call("s", "c1", [1, 2], [3], at_ms=T0))
    (late,) = join.on_feedback(rating("s", 1.0, at_ms=T0 + 61_000), "f1")
    assert isinstance(late, Rejected) and late.error_type == "LateFeedback"
    assert "window" in late.reason
    assert join.stats.feedback_late == 1 and join.stats.trajectories_rewarded == 0


def test_feedback_for_a_finished_trajectory_is_late_and_unrewarded_are_counted() -> None:
    join = _join()
    join.on_interaction(call("s", "c1", [1, 2], [3], at_ms=T0))
    assert join.on_tick(T0 + 61_000) == []  # window over, no feedback: dropped
    assert join.stats.unrewarded_dropped == 1
    (late,) = join.on_feedback(rating("s", 1.0, at_ms=T0 + 62_000, interaction="c1"), "f1")
    assert isinstance(late, Rejected) and "already finished" in late.reason


def test_unrewarded_default_policy_emits_with_the_default_reward() -> None:
    join = _join(unrewarded="default", default_reward=-0.5)
    join.on_interaction(call("s", "c1", [1, 2], [3], at_ms=T0))
    (joined,) = join.on_tick(T0 + 61_000)
    assert isinstance(joined, Joined) and joined.trajectory.reward == -0.5
    assert joined.trajectory.metadata["reward_source"] == "default"
    assert join.stats.unrewarded_defaulted == 1


def test_feedback_naming_one_call_rewards_only_its_trajectory() -> None:
    join = _join()
    join.on_interaction(call("s", "a1", [1, 2], [3], at_ms=T0))
    join.on_interaction(call("s", "b1", [7, 8], [9], at_ms=T0 + 10))  # history_changed
    (joined,) = join.on_feedback(rating("s", 0.0, at_ms=T0 + 20, interaction="a1"), "f1")
    assert isinstance(joined, Joined) and joined.trajectory.metadata["interaction_ids"] == "a1"


def test_early_feedback_waits_for_its_calls_then_unmatched_goes_to_the_dlq() -> None:
    join = _join()
    assert join.on_feedback(rating("s", 1.0, at_ms=T0, interaction="c1"), "f1") == []
    (joined,) = join.on_interaction(call("s", "c1", [1, 2], [3], at_ms=T0 + 5))
    assert joined.trajectory.reward == 1.0 and join.stats.feedback_held == 0
    assert join.on_feedback(rating("x", 1.0, at_ms=T0), "f2") == []
    (unmatched,) = join.on_tick(T0 + 61_000)
    assert isinstance(unmatched, Rejected) and unmatched.error_type == "UnmatchedFeedback"


def test_wait_for_window_combines_every_feedback_source() -> None:
    join = _join(wait_for_window=True)
    join.on_interaction(call("s", "c1", [1, 2], [3], at_ms=T0))
    assert join.on_feedback(rating("s", 1.0, at_ms=T0 + 5), "f1") == []
    assert join.on_feedback(rating("s", 0.5, at_ms=T0 + 6, source="edit_kept"), "f2") == []
    assert join.on_feedback(rating("s", 0.5, at_ms=T0 + 6, source="edit_kept"), "f2") == []  # redelivered
    (joined,) = join.on_tick(T0 + 61_000)
    assert joined.trajectory.rewards == {"user": 1.0, "edit_kept": 0.5} and joined.trajectory.reward == 1.5


def test_redelivered_calls_are_ignored_and_state_survives_serialisation() -> None:
    sessions: dict[str, bytes] = {}
    join = FeedbackJoin(FeedbackJoin.Config(window_s=WINDOW_S), sessions)
    join.on_interaction(call("s", "c1", [1, 2], [3], at_ms=T0))
    restarted = FeedbackJoin(FeedbackJoin.Config(window_s=WINDOW_S), sessions)  # same table
    assert restarted.on_interaction(call("s", "c1", [1, 2], [3], at_ms=T0)) == []
    assert restarted.stats.duplicate_interactions == 1
    (joined,) = restarted.on_feedback(rating("s", 1.0, at_ms=T0 + 1), "f1")
    assert isinstance(joined, Joined)


class _Clock:
    now_ms = T0

    def __call__(self) -> int:
        return self.now_ms


async def test_faust_agent_joins_and_dead_letters_late_feedback() -> None:
    forwarder, clock = ListForwarder(), _Clock()
    app = OncallJoinApp(
        OncallJoinApp.Config(
            app_id=f"unit-{uuid.uuid4().hex[:8]}", partitions=2, join=FeedbackJoin.Config(window_s=WINDOW_S)
        ),
        forwarder=forwarder,
        clock=clock,
    )
    async with app.agent.test_context() as agent:
        await agent.put(encode(call("s", "c1", [1, 2], [3], at_ms=T0)), key=b"s", partition=1)
        await agent.put(encode(rating("s", 1.0, at_ms=T0 + 10)), key=b"s", partition=1)
        await agent.put(encode(call("t", "d1", [1], [2], at_ms=T0)), key=b"t", partition=0)
        await agent.put(encode(rating("t", 1.0, at_ms=T0 + 70_000)), key=b"t", partition=0)
        await agent.put(b"garbage", key=b"u", partition=0)
    (out,) = forwarder.on(app.config.trajectories_topic)
    assert decode(out.value, Trajectory).metadata["session_id"] == "s" and out.key == b"s"
    letters = [decode(o.value, DeadLetter) for o in forwarder.on(app.config.dlq_topic)]
    assert sorted(d.error_type for d in letters) == ["CodecError", "LateFeedback"]
    assert app.stats.feedback_late == 1 and app.stats.invalid == 1


def _join_app(reader: RecordsReader, *, quiet_check_s: float = 5.0) -> tuple[OncallJoinApp, ListForwarder]:
    forwarder = ListForwarder()
    config = OncallJoinApp.Config(
        app_id=f"unit-{uuid.uuid4().hex[:8]}",
        partitions=2,
        quiet_check_s=quiet_check_s,
        join=FeedbackJoin.Config(window_s=WINDOW_S),
    )
    return OncallJoinApp(config, forwarder=forwarder, clock=_Clock(), gap_reader=reader), forwarder


async def test_an_interaction_the_consumer_dropped_is_read_from_kafka_and_joined_first() -> None:
    logs = OncallJoinApp.Config().agent_logs_topic
    reader = RecordsReader([kafka_record(logs, 0, encode(call("s", "c1", [1, 2], [3], at_ms=T0)), b"s", 1)])
    app, forwarder = _join_app(reader)
    async with app.agent.test_context() as agent:
        with on_topic(agent, app.config.agent_logs_topic):
            agent.sent_offset = 1  # offset 0, the committed one, never reaches the agent
            await agent.put(encode(call("s", "c2", [1, 2, 3], [4], at_ms=T0 + 5)), key=b"s", partition=1)
        assert reader.reads == [(logs, 1, range(0, 1))]
        with on_topic(agent, app.config.feedback_topic):
            agent.sent_offset = 0
            await agent.put(encode(rating("s", 1.0, at_ms=T0 + 10)), key=b"s", partition=1)
    (out,) = forwarder.on(app.config.trajectories_topic)
    assert app.stats.interactions == 2 and app.stats.feedback_joined == 1
    assert decode(out.value, Trajectory).metadata["session_id"] == "s"


async def test_a_second_delivery_of_an_interaction_is_skipped() -> None:
    app, _ = _join_app(RecordsReader())
    async with app.agent.test_context() as agent:
        with on_topic(agent, app.config.agent_logs_topic):
            await agent.put(encode(call("s", "c1", [1, 2], [3], at_ms=T0)), key=b"s", partition=0)
            agent.sent_offset = 0  # Faust reads from the committed offset again
            await agent.put(encode(call("s", "c1", [1, 2], [3], at_ms=T0)), key=b"s", partition=0)
    assert app.stats.interactions == 1 and app.stats.duplicate_interactions == 0


async def test_the_dropped_last_feedback_of_a_quiet_partition_is_read_on_a_tick() -> None:
    feedback = OncallJoinApp.Config().feedback_topic
    lost = kafka_record(feedback, 0, encode(rating("s", 1.0, at_ms=T0 + 10)), b"s", 1)
    reader = RecordsReader([lost])
    app, forwarder = _join_app(reader, quiet_check_s=0.05)
    await app._on_partitions_assigned(app.app, {TP(feedback, 1)})
    async with app.agent.test_context() as agent:
        with on_topic(agent, app.config.agent_logs_topic):
            await agent.put(encode(call("s", "c1", [1, 2], [3], at_ms=T0)), key=b"s", partition=1)
        await asyncio.sleep(0.1)  # the feedback partition stays quiet
        with on_topic(agent, app.config.ticks_topic):
            await agent.put(str(T0 + 20).encode(), key=ONCALL_TICK_KEY, partition=1)
    assert (feedback, 1, range(0, 1)) in reader.reads
    assert app.stats.feedback_joined == 1 and len(forwarder.on(app.config.trajectories_topic)) == 1


class _BrokenReader(RecordsReader):
    def read(self, topic: str, partition: int, offsets: range) -> list[Any]:
        raise AssemblyError("the broker did not answer")


class _Stream:
    """What the join agent reads of a Faust stream: its events, and what it acknowledges."""

    def __init__(self, events: list[Any]) -> None:
        self._events = events
        self.acked: list[Any] = []

    def noack(self) -> _Stream:
        return self

    async def events(self) -> AsyncIterator[Any]:
        for event in self._events:
            yield event

    async def ack(self, event: Any) -> None:
        self.acked.append(event)


def _event(topic: str, offset: int, value: bytes) -> Any:
    message = SimpleNamespace(
        topic=topic, partition=0, tp=TP(topic, 0), offset=offset, generation_id=1, key=b"s", value=value
    )
    return SimpleNamespace(message=message)


async def test_an_event_whose_missing_records_cannot_be_read_is_not_acknowledged() -> None:
    app, _ = _join_app(_BrokenReader())
    crashed: list[BaseException] = []

    async def crash(exc: BaseException) -> None:
        crashed.append(exc)

    app.app.crash = crash  # type: ignore[method-assign,assignment]
    app.join = FeedbackJoin(app.config.join, {}, app.stats)  # a Faust table changes only in its stream
    logs = app.config.agent_logs_topic
    first = _event(logs, 0, encode(call("s", "c1", [1, 2], [3], at_ms=T0)))
    second = _event(logs, 2, encode(call("s", "c2", [1, 2], [3], at_ms=T0)))  # offset 1 cannot be read
    stream = _Stream([first, second])
    outputs = [out async for out in app._stream(stream)]  # type: ignore[arg-type]
    assert stream.acked == [first] and outputs == [[], []]  # a lone call emits nothing yet
    assert len(crashed) == 1 and app.stats.interactions == 1


def test_the_session_settings_are_checked_and_reach_faust() -> None:
    with pytest.raises(ValueError, match="heartbeat_interval_s=3.0 must be > 0 and at most a third"):
        OncallJoinApp.Config(session_timeout_s=6.0, heartbeat_interval_s=3.0)
    app = OncallJoinApp(OncallJoinApp.Config(partitions=2), forwarder=ListForwarder()).app
    assert app.conf.broker_session_timeout == 10.0  # Faust's own is 60 s: a restart waited a minute
    assert app.conf.broker_heartbeat_interval == 3.0
    assert app.fetch_max_wait_ms == 100  # type: ignore[attr-defined]


async def test_a_lagging_join_keeps_windows_open_until_the_feedback_on_time_is_read() -> None:
    """The worker's clock is 100 s past a 60 s window, but the feedback sent 5 s after the call
    is still unread in Kafka: the tick must not end the window (event time), the feedback joins."""
    logs, feedback = OncallJoinApp.Config().agent_logs_topic, OncallJoinApp.Config().feedback_topic
    timely = kafka_record(feedback, 0, encode(rating("s", 1.0, at_ms=T0 + 5_000)), b"s", 0)
    app, forwarder = _join_app(RecordsReader([timely]))
    app.clock.now_ms = T0 + 100_000  # type: ignore[attr-defined]
    await app._on_partitions_assigned(app.app, {TP(logs, 0), TP(feedback, 0)})
    async with app.agent.test_context() as agent:
        with on_topic(agent, logs):
            await agent.put(encode(call("s", "c1", [1, 2], [3], at_ms=T0)), key=b"s", partition=0)
        with on_topic(agent, app.config.ticks_topic):
            await agent.put(str(T0 + 100_000).encode(), key=ONCALL_TICK_KEY, partition=0)
        assert app.stats.unrewarded_dropped == 0  # the feedback topic is behind: the window stays open
        with on_topic(agent, feedback):
            agent.sent_offset = 0
            await agent.put(timely.value(), key=b"s", partition=0)
    assert app.stats.feedback_joined == 1 and app.stats.feedback_late == 0
    assert forwarder.on(app.config.dlq_topic) == []
    (out,) = forwarder.on(app.config.trajectories_topic)
    assert decode(out.value, Trajectory).reward == 1.0


async def test_a_caught_up_join_ends_windows_on_the_wall_clock_less_the_grace() -> None:
    logs, feedback = OncallJoinApp.Config().agent_logs_topic, OncallJoinApp.Config().feedback_topic
    app, _ = _join_app(RecordsReader())
    await app._on_partitions_assigned(app.app, {TP(logs, 0), TP(feedback, 0)})
    grace_ms = int(app.config.join.grace_s * 1000)
    async with app.agent.test_context() as agent:
        with on_topic(agent, logs):
            await agent.put(encode(call("s", "c1", [1, 2], [3], at_ms=T0)), key=b"s", partition=0)
        for now, dropped in ((T0 + 60_001, 0), (T0 + 60_001 + grace_ms, 1)):
            app.clock.now_ms = now  # type: ignore[attr-defined]
            with on_topic(agent, app.config.ticks_topic):
                await agent.put(str(now).encode(), key=ONCALL_TICK_KEY, partition=0)
            assert app.stats.unrewarded_dropped == dropped


def test_the_event_clock_follows_the_slowest_input_less_the_grace() -> None:
    clock = EventClock(("logs", "feedback"), grace_ms=1_000)
    assert clock.watermark(0, 50_000) is None  # nothing known of either input
    clock.observe(0, "logs", 20_000)
    clock.caught_up(0, "logs", True)
    assert clock.watermark(0, 50_000) is None  # the feedback input's position is unknown
    clock.observe(0, "feedback", 12_000)
    clock.observe(0, "feedback", 9_000)  # out of order: the newest counts
    assert clock.watermark(0, 50_000) == 11_000
    clock.caught_up(0, "feedback", True)
    assert clock.watermark(0, 50_000) == 49_000
    assert clock.watermark(1, 50_000) is None  # partitions are apart
    with pytest.raises(ValueError, match="grace"):
        EventClock(("logs",), grace_ms=-1)


def test_an_open_trajectory_expires_only_after_its_whole_window() -> None:
    join = _join()
    join.on_interaction(call("s", "c1", [1, 2], [3], at_ms=T0))
    assert join.on_tick(T0 + 30_000) == []
    join.on_interaction(call("s", "c2", [1, 2, 3, 4], [5], at_ms=T0 + 30_000))  # still open: merges
    assert join.stats.merged_calls == 1
    assert join.on_tick(T0 + 90_000) == [] and join.stats.unrewarded_dropped == 0  # window end: kept
    assert join.on_tick(T0 + 90_001) == [] and join.stats.unrewarded_dropped == 1


def test_a_closed_trajectory_waits_its_window_for_feedback() -> None:
    join = _join()
    join.on_interaction(call("s", "a1", [1, 2], [3], at_ms=T0))
    join.on_interaction(call("s", "b1", [7, 8], [9], at_ms=T0 + 10))  # closes a1's trajectory
    assert join.on_tick(T0 + 30_000) == [] and join.on_tick(T0 + 60_000) == []
    assert join.stats.unrewarded_dropped == 0
    assert join.on_tick(T0 + 60_001) == [] and join.stats.unrewarded_dropped == 1
    assert join.on_tick(T0 + 60_011) == [] and join.stats.unrewarded_dropped == 2
    (late,) = join.on_feedback(rating("s", 1.0, at_ms=T0 + 70_000, interaction="a1"), "f1")
    assert isinstance(late, Rejected) and late.reason == (
        "late feedback for call a1: its trajectories were already finished "
        f"(window 60 s after the last call at {T0 + 10} ms)"
    )
    (late,) = join.on_feedback(rating("s", 1.0, at_ms=T0 + 70_000), "f2")
    assert isinstance(late, Rejected) and late.reason.startswith("late feedback for session s: ")
    # a call not seen yet in a finished session is not late: its feedback is held
    assert join.on_feedback(rating("s", 1.0, at_ms=T0 + 70_000, interaction="c9"), "f3") == []
    assert join.stats.feedback_held == 1


def test_every_trajectory_whose_window_ends_at_one_tick_is_emitted() -> None:
    join = _join(unrewarded="default", wait_for_window=True)
    join.on_interaction(call("s", "a1", [1, 2], [3], at_ms=T0))
    join.on_interaction(call("s", "b1", [7, 8], [9], at_ms=T0))
    assert join.on_feedback(rating("s", 1.0, at_ms=T0 + 5, interaction="a1"), "f1") == []
    join.on_interaction(call("t", "c1", [1], [2], at_ms=T0))  # another session
    out = join.on_tick(T0 + 60_001)
    assert sorted(o.trajectory.metadata["interaction_ids"] for o in out if isinstance(o, Joined)) == [
        "a1", "b1", "c1"
    ]  # fmt: skip
    assert len(out) == 3 and join.stats.unrewarded_defaulted == 2


def test_a_tick_for_one_partition_ends_only_its_sessions() -> None:
    join = _join(unrewarded="default")
    join.on_interaction(call("p0", "a1", [1], [2], at_ms=T0), partition=0)
    join.on_interaction(call("p1", "b1", [1], [2], at_ms=T0), partition=1)
    (joined,) = join.on_tick(T0 + 60_001, partition=1)
    assert isinstance(joined, Joined) and joined.trajectory.metadata["interaction_ids"] == "b1"


def test_early_feedback_is_held_one_window_then_each_is_dead_lettered() -> None:
    join = _join()
    assert join.on_feedback(rating("x", 1.0, at_ms=T0), "f1") == []
    assert join.on_feedback(rating("x", 1.0, at_ms=T0), "f2") == []
    assert join.on_feedback(rating("x", 1.0, at_ms=T0 + 10_000), "f3") == []
    assert join.stats.feedback_held == 3
    assert join.on_tick(T0 + 30_000) == [] and join.on_tick(T0 + 60_000) == []
    out = join.on_tick(T0 + 60_001)
    assert [(o.error_type, o.reason) for o in out if isinstance(o, Rejected)] == [
        ("UnmatchedFeedback", "unmatched feedback: no call of its session/interaction arrived within 60 s")
    ] * 2
    assert len(out) == 2 and join.stats.feedback_held == 1 and join.stats.feedback_unmatched == 2


def test_only_idle_sessions_are_forgotten_after_forget_after_s() -> None:
    join = _join(forget_after_s=100.0, wait_for_window=True)
    join.on_interaction(call("done", "d1", [1], [2], at_ms=T0))
    join.on_interaction(call("done2", "e1", [1], [2], at_ms=T0))
    join.on_tick(T0 + 60_001)  # both dropped: finished at T0
    assert set(join.sessions) == {"done", "done2"}
    join.on_interaction(call("open", "o1", [1], [2], at_ms=T0 + 100_000))
    join.on_interaction(call("rated", "r1", [1], [2], at_ms=T0 + 100_000))
    join.on_feedback(rating("rated", 1.0, at_ms=T0 + 100_001), "f1")  # pending with its feedback
    join.on_tick(T0 + 100_000)
    assert set(join.sessions) == {"done", "done2", "open", "rated"}  # finished + 100 s: not yet
    join.on_tick(T0 + 100_001)
    assert set(join.sessions) == {"open", "rated"}  # both idle sessions forgotten, busy ones kept
    join.on_interaction(call("open", "o2", [1, 2, 3], [4], at_ms=T0 + 101_000))
    assert join.stats.merged_calls == 1
    (joined,) = join.on_tick(T0 + 160_001 + 1_000)
    assert isinstance(joined, Joined) and joined.trajectory.metadata["interaction_ids"] == "r1"


def test_finished_trajectories_carry_their_reward_source_and_first_feedback_time() -> None:
    join = _join(unrewarded="default", default_reward=-0.5)
    join.on_interaction(call("s", "a1", [1, 2], [3], at_ms=T0))
    join.on_feedback(rating("s", 1.0, at_ms=T0 + 7, interaction="a1"), "f1")
    join.on_interaction(call("s", "b1", [7], [8], at_ms=T0 + 10))
    join.on_interaction(call("s", "c1", [9], [8], at_ms=T0 + 20))  # closes b1's trajectory
    defaulted = join.on_tick(T0 + 60_021)
    records = [o.trajectory for o in defaulted if isinstance(o, Joined)]
    assert [t.rewards for t in records] == [{"default": -0.5}, {"default": -0.5}]
    assert [t.metadata["first_feedback_ms"] for t in records] == ["0", "0"]
    assert [t.sample_index for t in records] == [1, 2]  # numbered per session after a1's
    assert join.stats.trajectories_rewarded == 1


def test_the_first_feedback_time_is_the_earliest_of_its_feedback() -> None:
    join = _join(wait_for_window=True)
    join.on_interaction(call("s", "a1", [1, 2], [3], at_ms=T0))
    join.on_feedback(rating("s", 1.0, at_ms=T0 + 7), "f1")
    join.on_feedback(rating("s", 0.5, at_ms=T0 + 5, source="judge"), "f2")
    join.on_interaction(call("s", "b1", [1, 2, 3, 4], [5], at_ms=T0 + 9))  # after the feedback
    assert join.stats.new_trajectory_reasons["after_feedback"] == 1
    (joined, *_) = join.on_tick(T0 + 60_001)
    assert isinstance(joined, Joined) and joined.trajectory.metadata["first_feedback_ms"] == str(T0 + 5)


def test_late_feedback_is_counted_each_time_and_the_window_end_still_joins() -> None:
    join = _join()
    join.on_interaction(call("s", "a1", [1, 2], [3], at_ms=T0))
    join.on_interaction(call("s", "b1", [7], [8], at_ms=T0 + 50_000))  # a1 pending, b1 open
    (joined,) = join.on_feedback(rating("s", 1.0, at_ms=T0 + 70_000), "f1")  # a1's window is over
    assert isinstance(joined, Joined) and joined.trajectory.metadata["interaction_ids"] == "b1"
    join.on_interaction(call("t", "c1", [1], [2], at_ms=T0))
    (exact,) = join.on_feedback(rating("t", 1.0, at_ms=T0 + 60_000), "f2")  # at the window's end
    assert isinstance(exact, Joined)
    join.on_tick(T0 + 200_000)
    for fid in ("f3", "f4"):
        (late,) = join.on_feedback(rating("t", 1.0, at_ms=T0 + 200_000), fid)
        assert isinstance(late, Rejected) and late.error_type == "LateFeedback"
    assert join.stats.feedback_late == 2


def test_redeliveries_and_merges_are_counted_and_default_partition_is_zero() -> None:
    join = _join()
    first = call("s", "c1", [1], [2], at_ms=T0)
    join.on_interaction(first)
    join.on_interaction(first)
    join.on_interaction(first)
    join.on_interaction(call("s", "c2", [1, 2, 3], [4], at_ms=T0 + 1))
    join.on_interaction(call("s", "c3", [1, 2, 3, 4, 5], [6], at_ms=T0 + 2))
    assert join.stats.duplicate_interactions == 2 and join.stats.merged_calls == 2
    assert join.on_feedback(rating("x", 1.0, at_ms=T0), "f1") == []  # held, on partition 0
    out = join.on_tick(T0 + 60_003, partition=0)
    assert [type(o).__name__ for o in out] == ["Rejected"] and join.stats.unrewarded_dropped == 1


def test_the_feedback_id_is_its_own_else_its_kafka_coordinates() -> None:
    own = dataclasses.replace(rating("s", 1.0, at_ms=T0), metadata={"feedback_id": "fb-7"})
    assert feedback_id(own, "stacx.feedback", 2, 41) == "fb-7"
    assert feedback_id(rating("s", 1.0, at_ms=T0), "stacx.feedback", 2, 41) == "stacx.feedback:2:41"


def test_held_feedback_is_kept_in_the_session_state_with_its_fields() -> None:
    join = _join()
    feedback = dataclasses.replace(rating("s", 0.5, at_ms=T0, interaction="c1"), components={"style": 0.25})
    assert join.on_feedback(feedback, "f1") == []
    (held,) = SessionState.from_bytes(join.sessions["s"]).early_feedback
    assert held == {
        "id": "f1",
        "session_id": "s",
        "interaction_id": "c1",
        "reward": 0.5,
        "source": "user",
        "components": {"style": 0.25},
        "created_at_ms": T0,
    }


def test_held_feedback_waits_for_the_call_it_names_while_others_arrive() -> None:
    join = _join()
    assert join.on_feedback(rating("s", 1.0, at_ms=T0, interaction="c9"), "f1") == []
    assert join.on_feedback(rating("s", 0.5, at_ms=T0, interaction="c1"), "f2") == []
    assert join.stats.feedback_held == 2
    (joined,) = join.on_interaction(call("s", "c1", [1, 2], [3], at_ms=T0 + 5))  # f2's call, not f1's
    assert joined.trajectory.metadata["feedback_ids"] == "f2" and joined.trajectory.reward == 0.5
    assert join.stats.feedback_held == 1
    join.on_interaction(call("s", "c2", [7, 8], [9], at_ms=T0 + 6))  # not c9: f1 still waits
    assert join.stats.feedback_held == 1
    (joined,) = join.on_interaction(call("s", "c9", [4, 5], [6], at_ms=T0 + 7))
    assert joined.trajectory.metadata["feedback_ids"] == "f1"
    assert join.stats.feedback_held == 0


def test_feedback_after_the_window_of_the_trajectory_it_names_is_counted_each_time() -> None:
    join = _join()
    join.on_interaction(call("s", "a1", [1, 2], [3], at_ms=T0))
    join.on_interaction(call("s", "b1", [7], [8], at_ms=T0 + 50_000))  # a1 pending, b1 open
    for fid in ("f1", "f2"):
        (late,) = join.on_feedback(rating("s", 1.0, at_ms=T0 + 61_000, interaction="a1"), fid)
        assert isinstance(late, Rejected) and late.reason.startswith("late feedback: created ")
    assert join.stats.feedback_late == 2


def test_every_rewarded_trajectory_is_counted() -> None:
    join = _join()
    for i in range(3):
        join.on_interaction(call(f"s{i}", "c1", [1, 2], [3], at_ms=T0))
        (joined,) = join.on_feedback(rating(f"s{i}", 1.0, at_ms=T0 + 1), f"f{i}")
        assert isinstance(joined, Joined)
    assert join.stats.trajectories_rewarded == 3


def test_held_feedback_still_counted_after_some_of_it_expires() -> None:
    join = _join()
    for i, at_ms in enumerate([T0, T0, T0 + 10_000, T0 + 20_000]):
        assert join.on_feedback(rating("x", 1.0, at_ms=at_ms), f"f{i}") == []
    out = join.on_tick(T0 + 60_001)
    assert len(out) == 2 and join.stats.feedback_held == 2 and join.stats.feedback_unmatched == 2


def test_at_the_end_of_its_window_an_open_trajectory_still_takes_the_next_call() -> None:
    join = _join()
    join.on_interaction(call("s", "c1", [1, 2], [3], at_ms=T0))
    assert join.on_tick(T0 + 60_000) == []  # the window's last moment: still open
    join.on_interaction(call("s", "c2", [1, 2, 3, 4], [5], at_ms=T0 + 60_000))
    assert join.stats.merged_calls == 1
    (joined,) = join.on_feedback(rating("s", 1.0, at_ms=T0 + 60_001), "f1")
    assert isinstance(joined, Joined) and joined.trajectory.metadata["interaction_ids"] == "c1,c2"


def test_session_feedback_after_a_trajectory_finished_at_the_first_millisecond_is_late() -> None:
    join = _join()
    join.on_interaction(call("s", "c1", [1, 2], [3], at_ms=1))
    join.on_tick(60_002)  # dropped unrewarded: the session's last finished call is at 1 ms
    (late,) = join.on_feedback(rating("s", 1.0, at_ms=60_003), "f1")
    assert isinstance(late, Rejected) and late.error_type == "LateFeedback"
