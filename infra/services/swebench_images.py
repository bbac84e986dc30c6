"""Local environment images for SWE-bench instances, built here from public sources.

The harness pulls `swebench/sweb.eval.x86_64.*` images from a registry; this machine has none, and
conda's installer cannot be fetched. So an instance image is built from what is reachable: the
Python stand-in `stacx/base:python3-bookworm` (Debian's python3 and pip, the host's pip index), the
repository checked out at the instance's `base_commit` from a local git copy, and the instance's
environment commands (`stacx_environment`: pinned `pip install`s and the repository's install
command, from the harness's specs for its repository and version) run in the environment.

The image keeps the harness's layout, so the instance's own eval script runs unchanged: the
repository, a git work tree, at `/testbed`; the `testbed` environment activated by
`source /opt/miniconda3/bin/activate` + `conda activate testbed` (here a venv at
/opt/miniconda3/envs/testbed, and an `activate` that defines `conda activate NAME` for it).
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from stacx.infra import paths
from stacx.infra.services import harbor_images
from stacx.infra.services.errors import InfraError
from stacx.infra.services.sandbox_image import image_exists
from stacx.sandbox.backends import DockerBackend
from stacx.sandbox.images import STAND_IN_PYTHON

__all__ = ["ENVIRONMENT_FIELD", "build_instance_image", "find_repository", "image_tag"]

ENVIRONMENT_FIELD = "stacx_environment"
"""The instance column with the shell commands that install its environment (run in /testbed)."""

ACTIVATE = """# Stand-in for miniconda's bin/activate (conda cannot be installed here): `conda activate
# NAME` activates the venv /opt/miniconda3/envs/NAME, as the harness's eval scripts expect.
conda() {
    if [ "${1:-}" = activate ] && [ -f "/opt/miniconda3/envs/${2:-}/bin/activate" ]; then
        . "/opt/miniconda3/envs/$2/bin/activate"
    else
        echo "conda $*: this image has only 'conda activate testbed'" >&2
        return 1
    fi
}
"""

DOCKERFILE = """FROM {base}
RUN apt-get update && apt-get install -y --no-install-recommends git patch locales \\
    && rm -rf /var/lib/apt/lists/*
COPY activate /opt/miniconda3/bin/activate
RUN python3 -m venv /opt/miniconda3/envs/testbed
COPY testbed /testbed
COPY environment.sh /root/environment.sh
WORKDIR /testbed
RUN bash /root/environment.sh
RUN chown -R {user} /testbed
LABEL org.stacx.image=swebench-instance
"""
"""`{user}`: the sandbox user (stacx's plain sessions run as it on a read-only root file system,
/testbed a volume seeded from the image), so the eval script can reset and patch the tests."""


def image_tag(instance_id: str) -> str:
    """The local image of one instance."""
    return f"stacx/swebench:{instance_id.lower()}"


def find_repository(repos: Path, repo: str) -> Path:
    """The local git copy of `repo` (`owner/name`) under `repos`, bare or not: `owner+name`,
    `owner/name`, `owner__name` (SWE-bench's mirrors, also as `swe-bench+owner__name` or
    `swe-bench/owner__name`) or `name`, each possibly holding it in `repo/` (a fetched snapshot)."""
    owner, name = repo.split("/", 1)
    mirror = f"{owner}__{name}"
    folders = (f"{owner}+{name}", f"{owner}/{name}", mirror, f"swe-bench+{mirror}", f"swe-bench/{mirror}",
               name)
    for folder in folders:
        for candidate in (repos / folder / "repo", repos / folder):
            if (candidate / "HEAD").is_file() or (candidate / ".git").exists():
                return candidate
    raise InfraError(f"{repos}: no git copy of {repo} (looked for {owner}+{name}, {owner}/{name}, {mirror}, "
                     f"swe-bench+{mirror}, {name}); clone it there")


def _environment_script(commands: Sequence[str]) -> str:
    return "\n".join(["set -euxo pipefail", "source /opt/miniconda3/bin/activate", "conda activate testbed",
                      "cd /testbed", *commands]) + "\n"


def _checkout(source: Path, commit: str, dest: Path) -> None:
    """`dest`: a git work tree at `commit` of the repository at `source`, with its parents (so
    the eval script's `git show` prints the commit's own diff, not the whole tree)."""
    steps = [["git", "init", "-q", str(dest)],
             ["git", "-C", str(dest), "fetch", "-q", "--depth", "2", f"file://{source.resolve()}", commit],
             ["git", "-C", str(dest), "checkout", "-q", "FETCH_HEAD"]]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise InfraError(f"{source}: cannot check out {commit}: {proc.stderr.strip()}")


def build_instance_image(
    instance: Mapping[str, Any], repos: Path, *, say: Callable[[str], None] = print, force: bool = False
) -> str:
    """Build (unless present) the local image of `instance`, tagged as its `image` column names
    (else `image_tag`); return the tag."""
    tag = str(instance.get("image") or image_tag(str(instance["instance_id"])))
    if image_exists(tag) and not force:
        say(f"{tag}: present")
        return tag
    commands = instance.get(ENVIRONMENT_FIELD)
    if not isinstance(commands, list) or not all(isinstance(c, str) for c in commands):
        raise InfraError(f"{instance['instance_id']}: {ENVIRONMENT_FIELD} must be a list of shell commands")
    harbor_images.build([STAND_IN_PYTHON], say=say)
    source = find_repository(repos, str(instance["repo"]))
    say(f"{tag}: building ({instance['repo']} at {str(instance['base_commit'])[:12]})")
    with tempfile.TemporaryDirectory(prefix="stacx-swebench-", dir=paths.stacx_home()) as tmp:
        context = Path(tmp)
        _checkout(source, str(instance["base_commit"]), context / "testbed")
        (context / "activate").write_text(ACTIVATE)
        (context / "environment.sh").write_text(_environment_script(commands))
        user = DockerBackend.Config().user
        (context / "Dockerfile").write_text(DOCKERFILE.format(base=STAND_IN_PYTHON, user=user))
        cmd = ["docker", "build", "--network", "host", "--pull=false", "-t", tag, str(context)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise InfraError(f"`docker build` of {tag} failed:\n{tail}")
    say(f"{tag}: built")
    return tag
