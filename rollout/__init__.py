"""STACX rollout engine: tasks in, training-ready trajectories out.

Public names are imported lazily (PEP 562), so `import rollout` (and its `inference` and
`models` subpackages) stays cheap.

    from stacx.rollout import RolloutManager, ListTaskSource
    manager = RolloutManager(config, source=..., tokenizer=..., inference=..., publisher=...,
                             sandbox=...)
    summary = await manager.run(num_groups=8)
"""

from __future__ import annotations

from stacx.schemas.lazy import lazy_attributes

__all__ = [
    "Evaluator",
    "GatewayEnvironments",
    "HFTokenizer",
    "InferenceAdapter",
    "JsonlTaskSource",
    "KafkaTaskSource",
    "KafkaTrajectoryPublisher",
    "ListTaskSource",
    "ResourcePool",
    "Resources",
    "RolloutConfig",
    "RolloutError",
    "RolloutManager",
    "TaskScheduler",
    "WeightsFollower",
    "load_config",
    "register_reward",
    "run_rollout",
]

_HOMES = {
    "Evaluator": "stacx.rollout.evaluator",
    "GatewayEnvironments": "stacx.rollout.gateways",
    "HFTokenizer": "stacx.rollout.tokens",
    "InferenceAdapter": "stacx.rollout.adapters",
    "JsonlTaskSource": "stacx.rollout.data",
    "KafkaTaskSource": "stacx.rollout.task_stream",
    "KafkaTrajectoryPublisher": "stacx.rollout.adapters",
    "ListTaskSource": "stacx.rollout.data",
    "ResourcePool": "stacx.rollout.resources",
    "Resources": "stacx.rollout.resources",
    "RolloutConfig": "stacx.rollout.config",
    "RolloutError": "stacx.rollout.errors",
    "RolloutManager": "stacx.rollout.manager",
    "TaskScheduler": "stacx.rollout.scheduler",
    "WeightsFollower": "stacx.rollout.adapters",
    "load_config": "stacx.rollout.config",
    "register_reward": "stacx.rollout.rewards",
    "run_rollout": "stacx.rollout.service",
}


__getattr__ = lazy_attributes(__name__, _HOMES)
