"""Exceptions of the `schemas` package: one root, `SchemaError`."""

from __future__ import annotations

__all__ = [
    "CodecError",
    "IncompatibleSchemaError",
    "RecordValidationError",
    "SchemaError",
    "UnknownSchemaError",
]


class SchemaError(Exception):
    """Root of every error raised by `schemas`."""

    retriable = False


class CodecError(SchemaError):
    """Bytes that are not a STACX event (bad marker, truncated or corrupt Avro body)."""


class UnknownSchemaError(CodecError):
    """The writer schema of an event is not known to this reader (nor found in the catalogue)."""

    def __init__(self, fingerprint: str, detail: str = "") -> None:
        self.fingerprint = fingerprint
        hint = detail or (
            "the writer did not register it in the schema catalogue; "
            "publish with an EventProducer or run `stacx schemas register`"
        )
        super().__init__(f"unknown writer schema fingerprint {fingerprint}: {hint}")


class IncompatibleSchemaError(SchemaError):
    """A schema change breaks Avro resolution against a registered version."""

    def __init__(self, name: str, problems: list[str]) -> None:
        self.name = name
        self.problems = problems
        super().__init__(f"schema {name} is incompatible: " + "; ".join(problems))


class RecordValidationError(SchemaError):
    """A decoded record violates an invariant of its type (e.g. array lengths differ)."""

    def __init__(self, record_type: str, problems: list[str]) -> None:
        self.record_type = record_type
        self.problems = problems
        super().__init__(f"invalid {record_type}: " + "; ".join(problems))
