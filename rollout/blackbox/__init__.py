"""Black-box agent scaffolds: third-party agents run as one process per episode, their model
calls captured by the agent proxy and joined into the episode's trajectory (docs/rollout.md).

    from stacx.rollout.blackbox import ExternalScaffold, register
"""

from stacx.rollout.blackbox.adapter import EXTERNAL_SCAFFOLDS, EpisodeSpec, ExternalScaffold, register

__all__ = ["EXTERNAL_SCAFFOLDS", "EpisodeSpec", "ExternalScaffold", "register"]
