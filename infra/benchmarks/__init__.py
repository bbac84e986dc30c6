"""Built-in benchmark suites for `stacx bench`: one adapter per suite, each a plug-in of the
`benchmarks` extension point (see docs/benchmarks.md)."""

from stacx.infra.benchmarks.protocols import BenchmarkSuite, LoadedSuite, SuiteScore, TaskOutcome
from stacx.infra.benchmarks.registry import BENCHMARKS, build_suite

__all__ = ["BENCHMARKS", "BenchmarkSuite", "LoadedSuite", "SuiteScore", "TaskOutcome", "build_suite"]
