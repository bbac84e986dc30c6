"""The chaos soak's audit helpers (bench/chaos.py), on fakes: the versions a server loaded are read
from its weight subscriber's own log lines; a lone-rank strike finds the ranks; the schedule
passes over a victim whose restart budget one more kill would spend."""

from __future__ import annotations

import importlib.util
import logging
import multiprocessing
import os
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from stacx.consumers import weights
from stacx.infra.pipeline.services import RestartPolicy
from stacx.schemas.records import WeightVersion

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_chaos", REPO / "bench" / "chaos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_chaos"] = module
    spec.loader.exec_module(module)
    return module


def _subscriber_line(version: int, path: str) -> str:
    """The line the weight subscriber logs after a confirmed load (its own logger and format)."""
    record = logging.LogRecord(weights.log.name, logging.INFO, "", 0, "server %s now serves %s v%s (%s)",
                               ("http://127.0.0.1:1", "policy", version, path), None)
    return logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s").format(record)


def test_served_versions_counts_regressions_unannounced_loads_and_lag(
    chaos: ModuleType, tmp_path: Path
) -> None:
    announced = [WeightVersion(model_name="policy", version=v, path=f"/w/v{v}") for v in (1, 2, 3, 4)]
    log_path = tmp_path / "inference.log"
    log_path.write_text("\n".join([
        "$ stacx serve ...", _subscriber_line(1, "/w/v1"), _subscriber_line(2, "/w/v2"),
        "$ stacx serve ...",  # restarted: catches up to the newest again
        _subscriber_line(2, "/w/v2"), _subscriber_line(3, "/w/v3"),
    ]) + "\n")
    clean = chaos.served_versions(log_path, "policy", announced)
    assert clean == {"server_loads": 4, "served_last": 3, "served_regressions": 0,
                     "served_unannounced": 0, "served_behind": 1}
    with log_path.open("a") as out:
        out.write(_subscriber_line(1, "/w/v1") + "\n" + _subscriber_line(4, "/elsewhere/v4") + "\n")
    bad = chaos.served_versions(log_path, "policy", announced)
    assert (bad["served_regressions"], bad["served_unannounced"], bad["served_behind"]) == (1, 1, 0)


def test_a_cluster_run_is_audited_from_every_hosts_logs(chaos: ModuleType, tmp_path: Path) -> None:
    """`stacx node up` writes `logs/<host>/<service>.log`: the servers of both rollout hosts are
    read (each on its own: one's older loads are no regression of the other's), and the groups
    the assembler dropped are found on its host."""
    announced = [WeightVersion(model_name="policy", version=v, path=f"/w/v{v}") for v in (1, 2, 3)]
    for host, versions in (("roll-1", (1, 2, 3)), ("roll-2", (1,))):
        (tmp_path / host).mkdir()
        lines = [_subscriber_line(v, f"/w/v{v}") for v in versions]
        (tmp_path / host / "inference.log").write_text("\n".join(lines) + "\n")
    (tmp_path / "train-1").mkdir()
    (tmp_path / "train-1" / "assembler.log").write_text("x group g7 of math-1 dropped: stale\n")
    served = chaos.served_by_servers(tmp_path, "policy", announced)
    assert served == {"server_loads": 4, "served_last": 3, "served_regressions": 0, "served_unannounced": 0,
                      "served_behind": 0,
                      "served_last_by_log": {"roll-1/inference.log": 3, "roll-2/inference.log": 1}}
    logs = chaos.service_logs(tmp_path, "assembler.log")
    assert logs == [tmp_path / "train-1" / "assembler.log"]
    assert chaos.dropped_groups(logs[0]) == {"g7": "stale"}
    (tmp_path / "assembler.log").write_text("")  # a one-host run's log comes first
    assert chaos.service_logs(tmp_path, "assembler.log")[0] == tmp_path / "assembler.log"


def _sleep(started: Any) -> None:
    started.set()
    time.sleep(30)


def test_rank_pids_finds_spawned_ranks_not_the_resource_tracker(chaos: ModuleType) -> None:
    context = multiprocessing.get_context("spawn")
    started = [context.Event() for _ in range(2)]
    ranks = [context.Process(target=_sleep, args=(event,)) for event in started]
    for rank in ranks:
        rank.start()
    try:  # start() returns before the child has exec'd; running Python, it has
        assert all(event.wait(timeout=60) for event in started)
        assert sorted(chaos.rank_pids(os.getpid())) == sorted(r.pid for r in ranks)
    finally:
        for rank in ranks:
            rank.kill()
            rank.join()


def test_the_schedule_respects_the_restart_budget(chaos: ModuleType) -> None:
    pipeline: Any = SimpleNamespace(supervisor=SimpleNamespace(policy=RestartPolicy(max_restarts=3)))
    schedule = chaos.Chaos(pipeline, seed=0, interval_s=1.0, broker=False,
                           victims=("trainer", "trainer-rank", "assembler"))
    now = time.monotonic()
    schedule._recent["trainer"].extend([now, now])  # a third kill would leave no restart
    assert {schedule._within_budget("trainer-rank") for _ in range(20)} == {"assembler"}
    assert schedule._within_budget("assembler") == "assembler"


class _StuckConsumer:
    """A consumer of a 2-partition topic whose partition 1 never delivers its records (a broker
    that went away mid-read): partition 0 has 2 records, partition 1 has 3."""

    ends = {0: 2, 1: 3}

    def __init__(self, config: dict[str, Any]) -> None:
        self.delivered = [SimpleNamespace(error=lambda: None, offset=lambda o=o: o, partition=lambda: 0)
                          for o in range(2)]

    def list_topics(self, topic: str, timeout: float) -> Any:
        meta = SimpleNamespace(error=None, partitions={0: None, 1: None})
        return SimpleNamespace(topics={topic: meta})

    def get_watermark_offsets(self, part: Any, timeout: float) -> tuple[int, int]:
        return 0, self.ends[part.partition]

    def assign(self, parts: list[Any]) -> None:
        pass

    def poll(self, timeout: float) -> Any:
        return self.delivered.pop(0) if self.delivered else None

    def close(self) -> None:
        pass


def test_read_topic_refuses_partial_data(chaos: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition not read to its end within the timeout is an AuditError naming it, never a
    shorter list the audit would count over (records missed would look lost, or not trained)."""
    import confluent_kafka

    monkeypatch.setattr(confluent_kafka, "Consumer", _StuckConsumer)
    with pytest.raises(chaos.AuditError, match=r"partitions \[1\] not read to their end .*2 records read"):
        chaos.read_topic("127.0.0.1:1", "stacx.run.trajectories", timeout_s=1)
