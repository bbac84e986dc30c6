from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from infra.config import ConfigError, bootstrap_servers, load_yaml, section


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
    with pytest.raises(ConfigError, match=r"f.yaml: demo.inner.depth must be int"):
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
