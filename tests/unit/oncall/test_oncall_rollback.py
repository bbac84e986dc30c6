"""`stacx oncall-rollback VERSION`: the weights of an earlier deployed version go out again under a new
number (a version number never carries two contents), and the history says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacx.schemas.records import WeightVersion
from stacx.trainer.oncall.deploy import Deployments, VersionHistory


class _Log:
    """The weights topic, in memory: what was published, in order."""

    def __init__(self) -> None:
        self.published: list[WeightVersion] = []

    def latest(self, model_name: str) -> WeightVersion | None:
        mine = [v for v in self.published if v.model_name == model_name]
        return mine[-1] if mine else None

    def publish(self, version: WeightVersion) -> None:
        self.published.append(version)

    def close(self) -> None:
        pass


def _deployments(tmp_path: Path) -> tuple[Deployments, _Log]:
    log = _Log()
    return Deployments(VersionHistory(tmp_path / "versions.jsonl"), log, "policy"), log  # type: ignore[arg-type]


def _promote(deployments: Deployments, path: str, step: int) -> int:
    version = deployments.deploy(path, step=step, metadata={})
    entry = {"kind": "promoted", "deployed_version": version.version, "path": path, "step": step}
    deployments.history.append(entry)
    return version.version


def test_rollback_redeploys_the_old_weights_under_a_new_number(tmp_path: Path) -> None:
    deployments, log = _deployments(tmp_path)
    v1 = _promote(deployments, "/exports/step-3", 3)
    v2 = _promote(deployments, "/exports/step-9", 9)
    assert (v1, v2) == (1, 2)

    back = deployments.rollback(v1)

    assert back.version == 3  # never 1 again: a number carries one content
    assert back.path == "/exports/step-3" and back.step == 3
    assert back.metadata == {"rollback_to": "1"}
    assert [v.version for v in log.published] == [1, 2, 3]
    last = deployments.history.entries()[-1]
    assert last["kind"] == "rollback" and last["rollback_to"] == 1 and last["deployed_version"] == 3
    assert deployments.next_version() == 4


def test_rollback_to_a_version_never_deployed_names_the_known_ones(tmp_path: Path) -> None:
    deployments, log = _deployments(tmp_path)
    _promote(deployments, "/exports/step-3", 3)
    with pytest.raises(Exception, match=r"version 7 was never deployed here; deployed versions: \[1\]"):
        deployments.rollback(7)
    assert [v.version for v in log.published] == [1]  # nothing published
