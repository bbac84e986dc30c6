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
        main(["assemble", "--web-port", port])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 2, lines
    assert len(lines) == 1 and "web_port must be a TCP port" in lines[0], lines
