"""bench/cluster.py's own verdict, on fakes: it exits non-zero when a check fails (a stall after a
loss, scale-out below the target on trained trajectories, anything lost or trained twice), and
counts scale-out on trained, not generated, trajectories."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_cluster", REPO / "bench" / "cluster.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_cluster"] = module
    spec.loader.exec_module(module)
    return module


def _args(**changes: object) -> argparse.Namespace:
    return argparse.Namespace(**{"versions": 5, "recovery_s": 300.0, "min_scale_out": 1.7, **changes})


def _good() -> dict[str, object]:
    return {
        "rollout_scale_out": 1.8,
        "losses": {"sigkill": {"versions_within_recovery": 6}, "partition": {"versions_within_recovery": 5}},
        "lost": 0,
        "trained_twice": 0,
        "version_regressions": 0,
        "orphans": 0,
        "duplicate_slots": 3,  # reported, not a failure
    }


def test_a_good_run_passes_and_every_failed_check_is_one_line(bench: ModuleType) -> None:
    assert bench.failed_checks(_good(), _args()) == []
    bad = {**_good(), "error": "3 versions after the losses within 600s", "rollout_scale_out": 1.1, "lost": 2}
    bad["losses"] = {"sigkill": {"versions_within_recovery": 0}, "partition": {"versions_within_recovery": 5}}
    failed = bench.failed_checks(bad, _args())
    assert failed == [
        "3 versions after the losses within 600s",
        "rollout_scale_out 1.1 (trained trajectories) < 1.7",
        "sigkill: 0 new versions within 300s of the loss; want >= 5",
        "lost = 2; want 0",
    ]
    assert "trained_twice = None; want 0" in bench.failed_checks({**_good(), "trained_twice": None}, _args())


def test_scale_out_counts_trained_trajectories(bench: ModuleType) -> None:
    watch = bench.Watch.__new__(bench.Watch)
    watch.trajectories = [0.5, 1.5, 1.6, 1.7]  # generated: 1 then 3
    watch.batch_sizes = {"b1": 8, "b2": 8, "b3": 8}
    watch.trained = {"b1": 0.2, "b2": 1.2, "b3": 5.0}  # trained: 8 in each window, b3 later
    watch.version_times = [0.2, 1.2, 5.0]
    assert watch.rate(0, 1) == 1 and watch.rate(1, 2) == 3
    assert watch.trained_rate(0, 1) == watch.trained_rate(1, 2) == 8
    assert watch.first_version_after(2.0) == 3.0 and watch.first_version_after(6.0) is None


def test_the_exit_status_follows_the_checks(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / ".complete").touch()
    monkeypatch.setattr(sys, "argv", ["cluster.py", "--json", "--keep", str(tmp_path / "run")])
    monkeypatch.setattr(bench, "netlab_problem", lambda: None)
    monkeypatch.setattr(bench.kafka, "jar_dir", lambda: tmp_path)

    class _Lab:
        prefix, hosts = "sxtest", {}

        def __init__(self, names: object) -> None: ...

        def __enter__(self) -> _Lab:
            return self

        def __exit__(self, *exc: object) -> None: ...

    monkeypatch.setattr(bench, "NetLab", _Lab)
    monkeypatch.setattr(bench, "run", lambda args, lab, root: _good())
    assert bench.main() == 0
    monkeypatch.setattr(bench, "run", lambda args, lab, root: {**_good(), "trained_twice": 1})
    assert bench.main() == 1
