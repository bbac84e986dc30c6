"""`stacx models tiny` and `stacx serve` argument handling (no server is started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacx.infra.cli import build_parser


def _run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


def test_models_tiny_writes_a_loadable_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["models", "tiny", "--out", str(tmp_path / "m"), "--seed", "3"]) == 0
    assert (tmp_path / "m" / "model.safetensors").is_file()
    assert capsys.readouterr().out.strip() == str(tmp_path / "m")


def test_serve_rejects_a_directory_without_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(["serve", "--model", str(tmp_path)]) == 2
    assert "config.json" in capsys.readouterr().err


@pytest.mark.parametrize("missing", ["package", "gpu"])
def test_serve_sglang_explains_why_it_cannot_run(
    missing: str,
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    import torch

    from stacx.rollout.inference import sglang

    # Simulate the machine the check is about, whatever this one has.
    found = object() if missing == "gpu" else None
    monkeypatch.setattr(
        sglang.importlib.util,
        "find_spec",
        lambda name: found if name == "sglang" else importlib.util.find_spec(name),
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reason = sglang.unavailable_reason()
    assert reason is not None
    assert ("sglang package is not installed" in reason) == (missing == "package")
    assert ("no CUDA GPU" in reason) == (missing == "gpu")
    assert _run(["serve", "--engine", "sglang", "--model", str(tiny_model_dir)]) == 2
    assert reason in capsys.readouterr().err


def test_sglang_command_carries_matching_flags() -> None:
    from stacx.rollout.inference.sglang import SGLangServer

    command = SGLangServer(
        SGLangServer.Config(
            model_path="/m",
            port=31000,
            tp_size=2,
            weight_version="4",
            context_length=2048,
            extra_args=["--disable-cuda-graph"],
        )
    ).command()
    assert command[1:3] == ["-m", "sglang.launch_server"]
    pairs = dict(zip(command[3::2], command[4::2], strict=False))
    assert pairs["--model-path"] == "/m" and pairs["--port"] == "31000"
    assert pairs["--tp-size"] == "2" and pairs["--weight-version"] == "4"
    assert pairs["--context-length"] == "2048" and command[-1] == "--disable-cuda-graph"


def test_serve_reads_the_inference_section_and_flags_override_it(tmp_path: Path) -> None:
    from stacx.infra.commands.serve import serve_config

    path = tmp_path / "serve.yaml"
    path.write_text(
        "inference:\n  engine: sglang\n  tp_size: 2\n"
        "  server: {model_path: /m, port: 31000, torch_threads: 2, engine: {max_batch_size: 8}}\n"
    )
    flags = ["--port", "31001", "--max-batch-size", "4"]
    config = serve_config(build_parser().parse_args(["serve", "--config", str(path), *flags]))
    assert (config.engine, config.tp_size) == ("sglang", 2)
    server = config.server
    assert (server.model_path, server.port, server.torch_threads) == ("/m", 31001, 2)
    assert server.engine.max_batch_size == 4


def test_a_bad_inference_section_names_each_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("inference:\n  server: {model_path: /m, port: high, threds: 2}\n")
    assert _run(["serve", "--config", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert f"stacx serve: {path}: inference.server.port: expected a valid integer, got 'high'" in lines
    unknown = f"stacx serve: {path}: inference.server.threds: unknown field"
    assert any(line.startswith(unknown) for line in lines)
