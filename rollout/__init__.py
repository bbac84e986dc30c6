"""STACX rollout engine: tasks in, training-ready trajectories out.

Public names are imported lazily (PEP 562), so `import rollout` (and its `inference` and
`models` subpackages) stays cheap.

    from rollout import RolloutManager, ListTaskSource
    manager = RolloutManager(config, source=..., tokenizer=..., inference=..., publisher=...,
                             sandbox=...)
    summary = await manager.run(num_groups=8)
"""

from __future__ import annotations

from schemas.lazy import lazy_attributes

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
    "Evaluator": "rollout.evaluator",
    "GatewayEnvironments": "rollout.gateways",
    "HFTokenizer": "rollout.tokens",
    "InferenceAdapter": "rollout.adapters",
    "JsonlTaskSource": "rollout.data",
    "KafkaTaskSource": "rollout.data",
    "KafkaTrajectoryPublisher": "rollout.adapters",
    "ListTaskSource": "rollout.data",
    "ResourcePool": "rollout.resources",
    "Resources": "rollout.resources",
    "RolloutConfig": "rollout.config",
    "RolloutError": "rollout.errors",
    "RolloutManager": "rollout.manager",
    "TaskScheduler": "rollout.scheduler",
    "WeightsFollower": "rollout.adapters",
    "load_config": "rollout.config",
    "register_reward": "rollout.rewards",
    "run_rollout": "rollout.service",
}


__getattr__ = lazy_attributes(__name__, _HOMES)
