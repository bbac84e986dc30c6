"""STACX: Kafka-centred infrastructure for agentic reinforcement learning of LLMs.

One import namespace. The product's folders (`schemas/`, `producers/`, `consumers/`, `rollout/`,
`sandbox/`, `trainer/`, `infra/`) are subpackages of `stacx` (`stacx/<folder>` links to each), so a
user's own top-level `trainer/` or `schemas/` never shadows ours.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("stacx")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
