"""Local SWE-bench instance images: where the repository copies are found, the `conda activate`
stand-in the eval scripts run through (with bash, under the scripts' `set -u`), and the one-line
refusals of `stacx bench images`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stacx.infra.cli import main
from stacx.infra.services.errors import InfraError
from stacx.infra.services.swebench_images import ACTIVATE, build_instance_image, find_repository

SAMPLES = Path(__file__).resolve().parents[2] / "benchmark_samples"


def test_a_repository_copy_is_found_in_each_layout(tmp_path: Path) -> None:
    mirror = tmp_path / "pallets+flask" / "repo"
    subprocess.run(["git", "init", "-q", "--bare", str(mirror)], check=True)
    assert find_repository(tmp_path, "pallets/flask") == mirror
    work = tmp_path / "sympy" / "sympy"
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    assert find_repository(tmp_path, "sympy/sympy") == work
    swe_mirror = tmp_path / "swe-bench+django__django" / "repo"
    subprocess.run(["git", "init", "-q", "--bare", str(swe_mirror)], check=True)
    assert find_repository(tmp_path, "django/django") == swe_mirror
    with pytest.raises(InfraError, match=r"no git copy of psf/requests .*clone it there"):
        find_repository(tmp_path, "psf/requests")


def test_conda_activate_testbed_activates_the_venv_under_set_u(tmp_path: Path) -> None:
    envs = tmp_path / "envs"
    (envs / "testbed" / "bin").mkdir(parents=True)
    (envs / "testbed" / "bin" / "activate").write_text('export ACTIVATED="$0"\n')
    activate = tmp_path / "activate"
    activate.write_text(ACTIVATE.replace("/opt/miniconda3/envs", str(envs)))
    script = f"set -uo pipefail; source {activate}; conda activate testbed && echo ok-$ACTIVATED"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("ok-"), done.stderr
    missing = subprocess.run(["bash", "-c", f"set -u; source {activate}; conda activate base"],
                             capture_output=True, text=True)
    assert missing.returncode == 1 and "only 'conda activate testbed'" in missing.stderr


def test_an_instance_without_environment_commands_is_refused() -> None:
    row = {"instance_id": "x__x-1", "image": "stacx/swebench:x__x-1-absent", "repo": "x/x",
           "base_commit": "0"}
    with pytest.raises(InfraError, match="x__x-1: stacx_environment must be a list of shell commands"):
        build_instance_image(row, Path("/nonexistent"), say=lambda _: None)


def _exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as done:
        main(argv)
    return int(done.value.code or 0)


def test_bench_images_says_in_one_line_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exit_code(["bench", "images", "gsm8k", "--from", str(tmp_path), "--repos", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        "stacx bench: images: gsm8k: only swe-bench-verified has instance images to build")
    missing = tmp_path / "absent"
    assert _exit_code(["bench", "images", "swe-bench-verified", "--from", str(SAMPLES / "swe-bench-verified"),
                       "--repos", str(missing)]) == 2
    assert capsys.readouterr().err.strip() == f"stacx bench: images: --repos {missing}: does not exist"
