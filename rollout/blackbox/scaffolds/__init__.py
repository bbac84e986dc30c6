"""The shipped black-box scaffold adapters (importing this package registers them)."""

from stacx.rollout.blackbox.scaffolds import mini_swe_agent, openhands, terminus2

__all__ = ["mini_swe_agent", "openhands", "terminus2"]
