from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stacx.infra.config import ConfigError, bootstrap_servers, load_yaml, section


@dataclass(kw_only=True, slots=True)
class InnerConfig:
    depth: int = 1


@dataclass(kw_only=True, slots=True)
class DemoConfig:
    name: str = "x"
    rate: float = 1.0
    tags: tuple[str, ...] = ()
    inner: InnerConfig = field(default_factory=InnerConfig)
    limit: int | None = None


def test_section_builds_nested_dataclasses() -> None:
    tree = {"demo": {"name": "a", "rate": 2, "tags": ["p", "q"], "inner": {"depth": 3}}}
    config = section(tree, "demo", DemoConfig, source="f.yaml")
    assert config == DemoConfig(name="a", rate=2.0, tags=("p", "q"), inner=InnerConfig(depth=3))


def test_unknown_field_names_file_field_and_valid_fields() -> None:
    with pytest.raises(ConfigError) as info:
        section({"demo": {"nmae": "a"}}, "demo", DemoConfig, source="f.yaml")
    message = str(info.value)
    assert "f.yaml: demo" in message and "nmae" in message and "valid fields" in message


def test_wrong_type_names_the_field() -> None:
    with pytest.raises(
        ConfigError, match=r"^f.yaml: demo.inner.depth: expected a valid integer, got 'deep'$"
    ):
        section({"demo": {"inner": {"depth": "deep"}}}, "demo", DemoConfig, source="f.yaml")


def test_missing_section_gives_defaults() -> None:
    assert section({}, "demo", DemoConfig) == DemoConfig()


def test_bad_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml is not valid YAML"):
        load_yaml(path)


def test_bootstrap_from_config_then_env(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("STACX_KAFKA", "10.0.0.1:9092")
    assert bootstrap_servers({"bootstrap_servers": "k:1"}) == "k:1"
    assert bootstrap_servers({}) == "10.0.0.1:9092"


def test_every_problem_is_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        section({"demo": {"rate": "fast", "nmae": 1}}, "demo", DemoConfig, source="f.yaml")
    assert info.value.lines == [
        "f.yaml: demo.rate: expected a valid number, got 'fast'",
        "f.yaml: demo.nmae: unknown field; valid fields: inner, limit, name, rate, tags; "
        "did you mean 'name'?",
    ]


def test_a_bare_file_names_the_field_after_a_colon() -> None:
    from stacx.infra.config import build

    with pytest.raises(ConfigError, match=r"^f.yaml: inner.depth: expected a valid integer"):
        build(DemoConfig, {"inner": {"depth": "x"}}, where="f.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "is empty; `stacx init` writes"), ("[1]\n", "must be a mapping of sections, got list")],
)
def test_empty_and_non_mapping_files_are_rejected(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_yaml(path)


def test_an_empty_file_is_allowed_where_asked(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("")
    assert load_yaml(path, allow_empty=True) == {}


def test_a_directory_is_not_a_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory; pass a YAML config file"):
        load_yaml(tmp_path)


def test_stacx_infra_reads_every_section_a_pipeline_file_may_have() -> None:
    """`stacx infra --config PIPELINE.yaml` takes what it needs and leaves each other section to its
    command: a section added to pipeline files (placement:, say) must not make it refuse them."""
    import dataclasses

    from stacx.infra.commands.infra import _StackFile
    from stacx.infra.pipeline.config import PipelineFile

    assert set(PipelineFile.model_fields) <= {f.name for f in dataclasses.fields(_StackFile)}
