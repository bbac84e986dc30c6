"""`stacx train` on several local ranks is a launcher: it spawns the ranks and waits, and never
imports torch (only the ranks hold tensors). A config problem a rank finds is still one line and
exit 2 at the launcher, as the checks before spawning are."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
LAUNCHER = textwrap.dedent(
    """
    import json, sys
    from stacx.infra.cli import main

    try:
        main(["train", sys.argv[1]])
    except SystemExit as exc:
        code = exc.code
    loaded = sorted(m for m in ("torch", "transformers") if m in sys.modules)
    print(json.dumps({"code": code, "loaded": loaded}), flush=True)
    """
)


def _launch(config: Path) -> tuple[dict[str, object], list[str]]:
    done = subprocess.run([sys.executable, "-c", LAUNCHER, str(config)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result, [line for line in done.stderr.splitlines() if line.startswith("stacx train:")]


@pytest.mark.timeout(360)
@pytest.mark.parametrize(
    ("trainer", "expected"),
    [
        ("recipe: nope\nmodels: {policy: {tiny: {}}}\n", "recipe: 'nope' is not a known recipe"),
        ("recipe: opd\nmodels: {policy: {tiny: {}}}\n", "needs models.teacher"),
    ],
    ids=["unknown recipe", "missing teacher"],
)
def test_the_launcher_of_two_ranks_never_imports_torch_and_reports_their_config_error(
    trainer: str, expected: str, tmp_path: Path
) -> None:
    config = tmp_path / "trainer.yaml"
    config.write_text(trainer + "backend: {kind: fsdp2, world_size: 2, device: cpu}\n"
                      "source: {kind: memory}\n")
    result, lines = _launch(config)
    assert result["loaded"] == [], "the launcher imported " + ", ".join(map(str, result["loaded"]))
    assert result["code"] == 2, lines
    assert len(lines) == 1 and expected in lines[0], lines
