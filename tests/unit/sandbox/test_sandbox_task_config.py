"""Every task.toml parsing rule: sizes, network, env templates, steps, warnings, unsupported tasks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from harbor_cookbook import MULTI_CONTAINER, SINGLE_CONTAINER, cookbook

from stacx.sandbox.errors import TaskFormatError
from stacx.sandbox.task_config import parse_size_mb, resolve_env
from stacx.sandbox.tasks import discover_tasks, find_task_dirs, load_task


def _task(tmp_path: Path, toml: str, name: str = "t") -> Path:
    root = tmp_path / name
    (root / "environment").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (root / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (root / "instruction.md").write_text("do it\n")
    (root / "task.toml").write_text(toml)
    return root


@pytest.mark.parametrize(
    ("value", "mb"),
    [
        ("4G", 4096),
        ("4g", 4096),
        ("4GB", 4096),
        ("4Gi", 4096),
        ("4GiB", 4096),
        ("1.5G", 1536),
        ("512M", 512),
        ("512MB", 512),
        ("512Mi", 512),
        ("2048K", 2),
        ("1T", 1 << 20),
        ("300", 300),
        (1024, 1024),
        (512.0, 512),
    ],
)
def test_size_forms(value: object, mb: int) -> None:
    assert parse_size_mb(value, "memory") == mb


@pytest.mark.parametrize("value", ["four gigs", "4X", "", "-1G", True, 0])
def test_bad_sizes_name_the_field(value: object) -> None:
    with pytest.raises(TaskFormatError, match="memory"):
        parse_size_mb(value, "memory")


def test_memory_string_is_not_the_default(tmp_path: Path) -> None:
    assert load_task(_task(tmp_path, '[environment]\nmemory = "4G"\n')).memory_mb == 4096
    assert load_task(_task(tmp_path, "[environment]\nmemory_mb = 1024\n", "b")).memory_mb == 1024
    assert load_task(_task(tmp_path, "", "c")).memory_mb == 2048


def test_memory_and_memory_mb_must_agree(tmp_path: Path) -> None:
    same = load_task(_task(tmp_path, '[environment]\nmemory = "1G"\nmemory_mb = 1024\n'))
    assert same.memory_mb == 1024
    with pytest.raises(TaskFormatError, match="disagree"):
        load_task(_task(tmp_path, '[environment]\nmemory = "2G"\nmemory_mb = 1024\n', "b"))


def test_storage_forms_and_warning(tmp_path: Path) -> None:
    task = load_task(_task(tmp_path, '[environment]\nstorage = "10G"\n'))
    assert task.storage_mb == 10240
    assert any("storage_mb = 10240 is not enforced" in w for w in task.warnings)
    assert load_task(_task(tmp_path, "[environment]\nstorage_mb = 500\n", "b")).storage_mb == 500


def test_version_is_the_legacy_schema_version(tmp_path: Path) -> None:
    assert load_task(_task(tmp_path, 'version = "1.0"\n')).schema_version == "1.0"
    assert load_task(_task(tmp_path, 'schema_version = "1.1"\n', "b")).schema_version == "1.1"


@pytest.mark.parametrize(
    ("toml", "internet"),
    [
        ("", False),
        ("allow_internet = true", True),
        ("allow_internet = false", False),
        ('network_mode = "public"', True),
        ('network_mode = "allowlist"\nallowed_hosts = ["pypi.org"]', True),
        ('network_mode = "no-network"', False),
        ('network_mode = "none"', False),
        ('network_mode = "no-network"\nallow_internet = true', False),
    ],
)
def test_network_fields(tmp_path: Path, toml: str, internet: bool) -> None:
    task = load_task(_task(tmp_path, f"[environment]\n{toml}\n"))
    assert task.wants_internet is internet
    assert any("internet" in w for w in task.warnings) is internet


def test_unknown_network_mode_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TaskFormatError, match="network_mode must be one of"):
        load_task(_task(tmp_path, '[environment]\nnetwork_mode = "wifi"\n'))


def test_env_sections_and_templates(tmp_path: Path) -> None:
    toml = (
        '[environment.env]\nA = "x"\n[verifier.env]\nB = "${HOME_DIR:-/root}"\n'
        '[solution.env]\nC = "${TOKEN}"\n[environment]\nworkdir = "/srv"\n'
    )
    task = load_task(_task(tmp_path, toml))
    assert (task.env, task.verifier_env, task.solution_env) == (
        {"A": "x"},
        {"B": "${HOME_DIR:-/root}"},
        {"C": "${TOKEN}"},
    )
    assert task.workdir == "/srv"
    assert resolve_env(task.verifier_env, "v", environ={}) == {"B": "/root"}
    assert resolve_env(task.verifier_env, "v", environ={"HOME_DIR": "/h"}) == {"B": "/h"}
    assert resolve_env(task.solution_env, "s", environ={"TOKEN": "t"}) == {"C": "t"}
    with pytest.raises(TaskFormatError, match=r"\$\{TOKEN\}.*export TOKEN"):
        resolve_env(task.solution_env, "s", environ={})


def test_relative_workdir_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TaskFormatError, match="workdir must be an absolute path"):
        load_task(_task(tmp_path, '[environment]\nworkdir = "app"\n'))


def test_every_unhonoured_field_is_a_warning(tmp_path: Path) -> None:
    toml = """
source = "somewhere"
artifacts = ["/app/out.txt"]
surprise = 1
[task]
name = "org/all-fields"
authors = [{ name = "A" }]
keywords = ["k"]
[agent]
timeout_sec = 10
user = "agent"
[verifier]
timeout_sec = 20
environment_mode = "separate"
[environment]
gpus = 0
gpu_types = ["H100"]
skills_dir = "/skills"
mcp_servers = [{ name = "tools", transport = "stdio", command = "srv" }]
healthcheck = { command = "true", retries = 2 }
os = "linux"
"""
    task = load_task(_task(tmp_path, toml))
    text = "\n".join(task.warnings)
    for expected in (
        "unknown field surprise",
        "artifacts",
        "user ignored",
        "environment_mode",
        "gpu_types",
        "skills_dir",
        "mcp_servers (tools)",
    ):
        assert expected in text, expected
    assert task.name == "org/all-fields" and task.agent_timeout_s == 10 and task.verifier_timeout_s == 20
    assert task.healthcheck is not None and task.healthcheck.retries == 2
    assert task.unsupported is None


@pytest.mark.parametrize(
    ("toml", "reason"),
    [("[environment]\ngpus = 1", "needs 1 GPU"), ('[environment]\nos = "Windows"', "windows container")],
)
def test_unsupported_tasks_say_why(tmp_path: Path, toml: str, reason: str) -> None:
    task = load_task(_task(tmp_path, toml))
    assert task.unsupported is not None and reason in task.unsupported


def test_docker_image_with_dockerfile_falls_back(tmp_path: Path) -> None:
    task = load_task(_task(tmp_path, '[environment]\ndocker_image = "org/img:1"\n'))
    assert task.image_tag == "org/img:1" and task.built_tag.startswith("stacx-task/t:")
    assert any("else environment/Dockerfile is built" in w for w in task.warnings)


def test_cookbook_recipes_parse() -> None:
    root = cookbook()
    tasks = {d.name: load_task(d) for d in find_task_dirs(root)}
    assert sorted(tasks) == sorted(SINGLE_CONTAINER + MULTI_CONTAINER)
    for name in SINGLE_CONTAINER:
        assert tasks[name].unsupported is None and tasks[name].has_solution, name
    for name in MULTI_CONTAINER:
        assert "not supported yet" in (tasks[name].unsupported or ""), name
    assert tasks["mcp-tools"].mcp_servers[0]["url"] == "http://mcp-server:8000/mcp"
    assert tasks["skills"].skills_dir == "/skills"


def test_multi_step_layout() -> None:
    task = load_task(cookbook() / "multi-step")
    assert task.multi_step and [s.name for s in task.steps] == ["scaffold", "implement", "document"]
    scaffold, implement, document = task.steps
    assert scaffold.instruction.startswith("Create an executable bash script")
    assert task.instruction == scaffold.instruction
    assert scaffold.config.min_reward == 1.0 and implement.config.min_reward == 0.5
    assert implement.config.verifier_env == {"EXPECTED_NAME": "Harbor", "EXPECTED_GREETING": "Hello, Harbor!"}
    assert (
        implement.config.healthcheck is not None
        and implement.config.healthcheck.command == "test -x /app/greet.sh"
    )
    assert (implement.workdir_dir / "setup.sh").is_file() and not scaffold.workdir_dir.exists()
    assert (implement.config.agent_timeout_s, implement.config.verifier_timeout_s) == (90.0, 30.0)
    assert document.config.artifacts == ["/app/README.md"] and task.artifacts == ["/app/greet.sh"]
    assert task.env == {"GREETER_PROJECT": "hello-multi-step-full"} and task.workdir == "/app"
    assert task.multi_step_reward_strategy == "mean" and task.has_solution


def test_multi_step_missing_step_files_are_named(tmp_path: Path) -> None:
    root = tmp_path / "ms"
    shutil.copytree(cookbook() / "multi-step", root)
    (root / "steps" / "implement" / "instruction.md").unlink()
    with pytest.raises(
        TaskFormatError, match=r"instruction.md is missing \(the instruction of step 'implement'\)"
    ):
        load_task(root)
    shutil.rmtree(root)
    shutil.copytree(cookbook() / "multi-step", root)
    (root / "steps" / "scaffold" / "tests" / "test.sh").unlink()
    with pytest.raises(TaskFormatError, match="tests/test.sh is missing"):
        load_task(root)


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ("steps = []", "non-empty array"),
        ("[[steps]]\nagent = {}", "needs name"),
        ('[[steps]]\nname = "../x"', "plain folder name"),
        ('[[steps]]\nname = "a"\n[[steps]]\nname = "a"', "unique"),
        ('[[steps]]\nname = "a"\nmin_reward = "high"', "min_reward must be a number"),
        ('multi_step_reward_strategy = "max"\n[[steps]]\nname = "a"', "'mean' or 'final'"),
    ],
)
def test_bad_steps_are_named(tmp_path: Path, steps: str, message: str) -> None:
    root = _task(tmp_path, steps + "\n")
    (root / "steps" / "a").mkdir(parents=True)
    (root / "steps" / "a" / "instruction.md").write_text("x")
    with pytest.raises(TaskFormatError, match=message):
        load_task(root)


def test_named_min_reward_thresholds(tmp_path: Path) -> None:
    root = _task(tmp_path, '[[steps]]\nname = "a"\nmin_reward = { correctness = 1.0, speed = 0.5 }\n')
    (root / "steps" / "a").mkdir(parents=True)
    (root / "steps" / "a" / "instruction.md").write_text("x")
    assert load_task(root).steps[0].config.min_reward == {"correctness": 1.0, "speed": 0.5}


def test_discovery_follows_symlinks_and_finds_broken_tasks(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    _task(real, "", "good")
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "linked").symlink_to(real / "good")
    broken = _task(folder, "", "broken")
    (broken / "instruction.md").unlink()
    found = find_task_dirs(folder)
    assert [p.name for p in found] == ["broken", "linked"]
    with pytest.raises(TaskFormatError, match="instruction.md is missing"):
        discover_tasks(folder)
