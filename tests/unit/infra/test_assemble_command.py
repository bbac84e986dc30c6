"""`stacx assemble` answers a section that is not a mapping with one line and exit 2."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from stacx.infra.cli import main


@pytest.fixture(autouse=True)
def _nothing_starts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the assembler started before its config was checked")

    monkeypatch.setattr("stacx.consumers.assembly.AssemblerApp.run", started)
    monkeypatch.setattr("stacx.infra.services.topics.missing_topics", started)
    previous = signal.getsignal(signal.SIGTERM)  # `stacx` installs its own handler
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize(("value", "kind"), [("5", "int"), ("[1, 2]", "list"), ("fast", "str")])
def test_an_assembler_section_that_is_not_a_mapping_is_one_line(
    value: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "a.yaml"
    path.write_text(f"assembler: {value}\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["assemble", "--config", str(path)])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"stacx assemble: {path}: section `assembler` must be a mapping of AssemblerApp.Config "
        f"fields, got {kind} ("
    ), lines


@pytest.mark.parametrize("port", ["0", "70000"])
def test_a_web_port_out_of_range_is_one_line(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Faust would die on it with a 59-line traceback after connecting to Kafka."""
    with pytest.raises(SystemExit) as exit_info:
        main(["assemble", "--web_port", port])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 2, lines
    assert len(lines) == 1 and "web_port must be a TCP port" in lines[0], lines


REPO = Path(__file__).resolve().parents[3]


def test_a_pipeline_files_section_alone_is_refused_not_run_on_the_shared_topics(
    capsys: pytest.CaptureFixture[str]
) -> None:
    path = REPO / "examples" / "quickstart.yaml"
    with pytest.raises(SystemExit) as exit_info:
        main(["assemble", "--config", str(path)])
    (line,) = capsys.readouterr().err.splitlines()
    assert exit_info.value.code == 2
    assert line.startswith(f"stacx assemble: {path}: assembler: a pipeline file's section gets per-run "
                           "topics from `stacx run` (pipeline.fresh_topics); run the service file the run "
                           "writes under runs/quickstart/config/")


def test_explain_prints_the_resolved_section_with_its_topics(capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    path = REPO / "examples" / "quickstart.yaml"
    with pytest.raises(SystemExit) as exit_info:
        main(["assemble", "--config", str(path), "--trajectories_topic", "t.run1",
              "--batches_topic", "b.run1", "--grouping.group_timeout_s", "30", "--explain"])
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert exit_info.value.code == 0
    assert (resolved["trajectories_topic"], resolved["batches_topic"]) == ("t.run1", "b.run1")
    assert resolved["grouping"]["group_size"] == 8  # the file's section, defaults written out
    assert resolved["grouping"]["group_timeout_s"] == 30.0  # a generated flag over the file's value


def test_a_bad_generated_flag_is_one_line_with_its_field_path(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["assemble", "--grouping.group_size", "0", "--mixture.batch_unit", "rows", "--explain"])
    lines = capsys.readouterr().err.splitlines()
    assert exit_info.value.code == 2
    assert [line.split(": ")[2] for line in lines] == ["assembler.grouping.group_size",
                                                       "assembler.mixture.batch_unit"], lines
