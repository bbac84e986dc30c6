"""Our Harbor semantics against Harbor's own code on shared cases: what reward.json holds
(booleans 1/0, numbers, what is refused) as Harbor's `VerifierResult` holds it, and the suite's
figure against Harbor's `Mean` metric (partial rewards kept, a failed trial 0). Harbor needs
Python >= 3.12, so it runs in its own venv (`STACX_HOME/venv-harbor-0.25.0`, built from the
package index once with pyenv's or the system's python3.12)."""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from stacx.infra.benchmarks import TaskOutcome, build_suite
from stacx.infra.paths import stacx_home
from stacx.sandbox.errors import SandboxError
from stacx.sandbox.verifier import parse_reward_json, scalar_reward

TESTS = Path(__file__).resolve().parents[2]
CASES = json.loads((TESTS / "benchmark_samples" / "graders" / "harbor_shared_cases.json").read_text())
HARBOR = "harbor==0.25.0"


def _python312() -> str:
    pyenv = sorted(glob.glob(str(Path.home() / ".pyenv" / "versions" / "3.12*" / "bin" / "python")))
    found = pyenv[-1] if pyenv else shutil.which("python3.12")  # pyenv's shim may not run it
    if found is None:
        pytest.fail("Harbor needs Python 3.12: install it (pyenv install 3.12) or put python3.12 on PATH")
    return found


@pytest.fixture(scope="module")
def harbor_python() -> Path:
    venv = stacx_home() / "venv-harbor-0.25.0"
    python, marker = venv / "bin" / "python", venv / ".stacx-ready"
    if not (python.exists() and marker.exists() and marker.read_text() == HARBOR):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([_python312(), "-m", "venv", str(venv)], check=True, timeout=300)
        done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                               HARBOR], capture_output=True, text=True, timeout=900, check=False)
        assert done.returncode == 0, f"installing {HARBOR} failed:\n{done.stderr[-2000:]}"
        marker.write_text(HARBOR)
    return python


@pytest.fixture(scope="module")
def reference(harbor_python: Path) -> dict[str, list[object]]:
    done = subprocess.run([str(harbor_python), str(TESTS / "harbor_reference.py")], input=json.dumps(CASES),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts: dict[str, list[object]] = json.loads(done.stdout)
    return verdicts


def _ours(text: str) -> dict[str, float] | None:
    try:
        return parse_reward_json(text.encode())
    except SandboxError:
        return None


@pytest.mark.timeout(1200)  # the first one builds Harbor's venv (litellm and all)
def test_reward_json_reads_as_harbor_reads_it(reference: dict[str, list[object]]) -> None:
    theirs = [None if r is None else {k: float(v) for k, v in r.items()}  # type: ignore[union-attr]
              for r in reference["reward_json"]]
    assert [_ours(text) for text in CASES["reward_json"]] == theirs
    assert _ours('{"reward": true}') == {"reward": 1.0}  # Harbor scores 1


@pytest.mark.timeout(1200)
def test_the_harbor_suites_figure_is_harbors_mean(reference: dict[str, list[object]]) -> None:
    for trials, mean in zip(CASES["trials"], reference["mean"], strict=True):
        # one trial per task; a trial without a verifier result is a failed episode: reward 0
        outcomes = [TaskOutcome(f"t{i}", [{"reward": scalar_reward(t) if t else 0.0}])
                    for i, t in enumerate(trials)]
        score = build_suite("terminal-bench-2").score(outcomes, k=1)
        assert score.value == pytest.approx(mean["mean"])  # type: ignore[index]
