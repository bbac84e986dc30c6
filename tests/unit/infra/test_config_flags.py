"""Flags generated from a config class: one per field path, help from the field's docstring,
YAML values, laid over the file's section as a nested mapping."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from stacx.infra.config_flags import add_config_flags, config_overrides, deep_merge


@dataclass(kw_only=True, slots=True)
class Inner:
    size: int = 8
    """How many. Second sentence."""
    names: list[str] = field(default_factory=list)
    """Which ones."""


@dataclass(kw_only=True, slots=True)
class Outer:
    topic: str = "t"
    """Where to write."""
    inner: Inner = field(default_factory=Inner)
    limit: float | None = None
    """Largest value (None: none)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_config_flags(parser, Outer)
    return parser


def test_one_flag_per_field_path_with_its_docstring() -> None:
    help_text = " ".join(_parser().format_help().split())
    for flag, doc in (("--topic str", "Where to write"), ("--inner.size int", "How many"),
                      ("--inner.names list", "Which ones"), ("--limit float", "Largest value (None: none)")):
        assert f"{flag} {doc}" in help_text, help_text
    assert "Second sentence" not in help_text


def test_given_flags_become_the_nested_mapping_a_file_would_hold() -> None:
    args = _parser().parse_args(["--inner.size", "0", "--inner.names", "[a, b]", "--topic", "123"])
    assert config_overrides(args) == {"inner": {"size": 0, "names": ["a", "b"]}, "topic": "123"}
    assert config_overrides(_parser().parse_args([])) == {}  # nothing given: nothing laid over the file


def test_overrides_lay_over_the_section_mapping_by_mapping() -> None:
    section = {"topic": "x", "inner": {"size": 4, "names": ["c"]}}
    assert deep_merge(section, {"inner": {"size": 0}}) == {"topic": "x", "inner": {"size": 0, "names": ["c"]}}
