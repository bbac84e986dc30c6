"""One trace per episode: the episode span holds its generate spans (GenAI attributes) and its
sandbox spans; nothing is recorded while tracing is off."""

from __future__ import annotations

from opentelemetry import trace
from test_rollout_manager import _manager, _tasks
from tracing_fixtures import in_memory_metrics, in_memory_tracing, metric_points

from stacx.producers.tracing import tracing_on


async def test_each_episode_is_one_trace_of_generate_and_sandbox_spans() -> None:
    with in_memory_tracing() as exported:
        manager = _manager(_tasks(2), samples=2)
        await manager.run()
        spans = exported.get_finished_spans()
    episodes = [s for s in spans if s.name == "rollout.episode"]
    assert len(episodes) == 4
    assert len({s.context.trace_id for s in episodes}) == 4  # one trace per episode
    for episode in episodes:
        inside = [s for s in spans if s.context.trace_id == episode.context.trace_id and s is not episode]
        assert all(s.parent is not None for s in inside)
        names = sorted(s.name for s in inside)
        assert names.count("text_completion policy") == 2, names
        assert {"sandbox.create", "sandbox.exec", "sandbox.close"} <= set(names), names
        generate = next(s for s in inside if s.name == "text_completion policy")
        assert generate.kind is trace.SpanKind.CLIENT
        assert generate.attributes["gen_ai.operation.name"] == "text_completion"
        assert generate.attributes["gen_ai.request.model"] == "policy"
        assert generate.attributes["gen_ai.usage.input_tokens"] > 0
        assert generate.attributes["gen_ai.usage.output_tokens"] > 0
        assert episode.attributes["stacx.trajectory_id"]
        assert episode.attributes["stacx.status"] == "COMPLETED"


async def test_episodes_record_nothing_while_tracing_is_off() -> None:
    assert not tracing_on()
    manager = _manager(_tasks(1))
    await manager.run()
    assert len(manager.publisher.published) == 1


async def test_the_rollout_counts_episodes_tokens_and_staleness() -> None:
    with in_memory_metrics() as reader:
        manager = _manager(_tasks(3), samples=2)
        await manager.run()
        points = metric_points(reader)
    assert sum(p.value for p in points["stacx.rollout.episodes"]) == 6
    assert {p.attributes["status"] for p in points["stacx.rollout.episodes"]} == {"COMPLETED"}
    assert sum(p.count for p in points["stacx.rollout.staleness"]) == 6
    assert sum(p.value for p in points["stacx.rollout.generated_tokens"]) > 0
