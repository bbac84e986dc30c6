"""The GPU path resolved on a CPU machine: SGLang launch lines, device placement, the router,
and a run that stops before starting anything when SGLang or CUDA is missing."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from stacx.infra.pipeline.config import parse_spec
from stacx.infra.pipeline.errors import PipelineConfigError
from stacx.infra.pipeline.layout import RunLayout, inference_services, router_section, trainer_section
from stacx.infra.pipeline.placement import ResourcesConfig, place
from stacx.infra.pipeline.resolve import serving_explained

REPO = Path(__file__).resolve().parents[3]
GPU = yaml.safe_load((REPO / "examples" / "gpu.yaml").read_text())


def _tree(**changes: Any) -> dict[str, Any]:
    tree = copy.deepcopy(GPU)
    tree["pipeline"]["plugin_paths"] = [str(REPO / "examples")]
    for section, values in changes.items():
        tree[section] = values
    return tree


def test_place_splits_servers_by_tp_size_and_refuses_overlap_unless_colocated() -> None:
    placed, problems = place(ResourcesConfig(trainer=[0, 1], inference=[2, 3, 4, 5]),
                             servers=2, tp_size=2, mem_fraction=None)
    assert problems == [] and placed.servers == [[2, 3], [4, 5]] and placed.trainer == [0, 1]
    _, problems = place(ResourcesConfig(trainer=[0], inference=[0]), servers=1, tp_size=1, mem_fraction=0.5)
    assert problems and "colocate" in problems[0]
    placed, problems = place(ResourcesConfig(trainer=[0], inference=[0], colocate=True),
                             servers=1, tp_size=1, mem_fraction=0.5)
    assert problems == [] and placed.servers == [[0]]
    _, problems = place(ResourcesConfig(trainer=[0], inference=[0], colocate=True),
                        servers=1, tp_size=1, mem_fraction=None)
    assert problems and "mem_fraction" in problems[0]
    _, problems = place(ResourcesConfig(inference=[1, 2, 3]), servers=2, tp_size=1, mem_fraction=None)
    assert problems and "2 x 1 = 2" in problems[0]


def test_gpu_example_resolves_launch_lines_devices_and_router_without_a_gpu() -> None:
    spec = parse_spec(_tree(), source="gpu.yaml", base_dir=REPO / "examples")
    layout = RunLayout.create(spec, now=0.0)
    model = Path("/models/m")
    servers = inference_services(spec, layout, model_dir=model)
    assert [s.name for s in servers] == ["inference-0", "inference-1"]
    assert [s.env for s in servers] == [{"CUDA_VISIBLE_DEVICES": "2"}, {"CUDA_VISIBLE_DEVICES": "3"}]
    assert [s.section["server"]["port"] for s in servers] == [30021, 30022]
    assert all(s.ready_path == "/health_generate" for s in servers)
    router = router_section(spec, layout, model_dir=model)
    assert router is not None and router["port"] == 30020
    assert router["upstreams"] == ["http://127.0.0.1:30021", "http://127.0.0.1:30022"]
    explained = serving_explained(spec, layout, model)
    command = explained["inference_servers"][1]["command"]
    assert command[1:3] == ["-m", "sglang.launch_server"]
    pairs = dict(zip(command[3::2], command[4::2], strict=False))
    assert pairs["--port"] == "30022" and pairs["--model-path"] == str(model)
    assert pairs["--mem-fraction-static"] == "0.8" and "--enable-metrics" in command
    assert explained["trainer"]["gpus"] == [0, 1]
    backend = trainer_section(spec, layout, model_dir=model)["backend"]
    assert (backend["kind"], backend["world_size"], backend["device"]) == ("fsdp2", 2, "cuda")


def test_one_builtin_server_keeps_the_cpu_layout() -> None:
    tree = _tree(inference={"server": {"port": 30010}})
    tree.pop("resources")
    tree["trainer"]["backend"] = {"kind": "fsdp2", "world_size": 2, "device": "cpu"}
    spec = parse_spec(tree, source="cpu.yaml", base_dir=REPO / "examples")
    layout = RunLayout.create(spec, now=0.0)
    (server,) = inference_services(spec, layout, model_dir=Path("/m"))
    assert (server.name, server.env, server.ready_path) == ("inference", {}, "/health")
    assert server.section["server"]["device"] == "cpu"
    assert router_section(spec, layout, model_dir=Path("/m")) is None


def test_bad_placement_and_owned_router_fields_are_one_line_each() -> None:
    tree = _tree(resources={"trainer": [0, 1], "inference": [1, 2]})
    tree["inference"]["router"] = {"port": 1234}
    tree["trainer"]["backend"]["world_size"] = 3
    with pytest.raises(PipelineConfigError) as caught:
        parse_spec(tree, source="gpu.yaml", base_dir=REPO / "examples")
    lines = str(caught.value).splitlines()
    assert any("resources: GPU(s) [1] are in both trainer and inference" in line for line in lines)
    assert any("inference.router.port=1234" in line for line in lines)
    assert any("trainer.backend.world_size=3 but resources.trainer lists 2" in line for line in lines)


def _stacx_run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stacx.infra.cli", "run", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_explain_on_the_gpu_example_prints_commands_placement_and_router(tmp_path: Path) -> None:
    done = _stacx_run([str(REPO / "examples" / "gpu.yaml"), "--explain"], tmp_path)
    assert done.returncode == 0, done.stderr
    doc = yaml.safe_load(done.stdout)
    servers = doc["placement"]["inference_servers"]
    assert [s["env"]["CUDA_VISIBLE_DEVICES"] for s in servers] == ["2", "3"]
    assert all("sglang.launch_server" in s["command"] for s in servers)
    assert doc["placement"]["router"]["url"] == "http://127.0.0.1:30020"


def test_run_without_sglang_or_cuda_stops_before_starting_anything(tmp_path: Path) -> None:
    import importlib.util

    import torch

    if importlib.util.find_spec("sglang") is not None and torch.cuda.is_available():
        pytest.fail("this test checks a machine without SGLang or CUDA; tests/gpu covers this one")
    done = _stacx_run([str(REPO / "examples" / "gpu.yaml")], tmp_path)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("  - ")]
    assert any(line.startswith("  - SGLang for inference.engine=sglang: ") for line in lines), done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()  # no run directory, no model, no service
