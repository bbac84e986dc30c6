"""Declarative recipes: model slots, roles with their specializations, and data syncs.

A recipe is data. `@recipe("name")` registers a function returning a `TrainingConfig`; the trainer
builds one model per slot, one worker per role and moves role outputs along the data syncs.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic

from stacx.schemas.plugins import PluginError, Registry, accepts, did_you_mean, first_line
from stacx.trainer.errors import RecipeError
from stacx.trainer.models import Head
from stacx.trainer.protocols import Specialization

__all__ = [
    "DataSync",
    "ModelSlot",
    "RECIPES",
    "Role",
    "TrainingConfig",
    "get_recipe",
    "list_recipes",
    "recipe",
    "role_options_problems",
]


@dataclass(kw_only=True, slots=True)
class ModelSlot:
    """One set of weights. Several roles may share a slot (shared weights)."""

    name: str
    """Slot name (`policy`, `reference`, `critic`, `reward`, `teacher`, ...)."""
    head: Head = "lm"
    """`lm` (logits), `value` (scalar per position), `lm+value` (both, one trunk) or `flow`
    (a 2-D flow-matching model, trainer/flow.py)."""
    trainable: bool = True
    """Frozen slots only run forward passes (no optimizer, not checkpointed)."""
    init: str = "policy"
    """Key of `TrainerConfig.models` whose weights initialise this slot."""
    group: str = "main"
    """Worker group (set of ranks) that hosts this model."""


@dataclass(kw_only=True, slots=True)
class Role:
    """A job done with one or more models: its specialization says how."""

    name: str
    """Role name (`policy`, `reference`, `critic`, `reward`, `teacher`)."""
    specialization: Specialization
    """Algorithm-specific batch preparation, output extraction and loss."""
    models: tuple[str, ...] = ("policy",)
    """Slots filling this role: outputs are averaged, losses summed (ensembles)."""


@dataclass(kw_only=True, slots=True)
class DataSync:
    """Send a role's (detached) output to another role, e.g. reference logprobs -> policy."""

    source: str
    """Role producing the tensor."""
    output: str
    """Key in the source role's `extract_model_output` result."""
    target: str
    """Role receiving it (in `batch.extras`)."""
    field: str
    """Name in the target's `batch.extras`."""


@dataclass(kw_only=True, slots=True)
class TrainingConfig:
    """A complete algorithm: which models exist, which roles use them, what flows between them."""

    description: str = ""
    """One line shown by `stacx recipes`."""
    models: list[ModelSlot]
    roles: list[Role]
    """Run in this order each step: sources of a data sync come before its target."""
    syncs: list[DataSync] = field(default_factory=list)
    groups: dict[str, int] = field(default_factory=lambda: {"main": 0})
    """Ranks per worker group; 0 = all ranks left over. Too few ranks: everything is colocated."""
    publish: str = "policy"
    """Slot whose weights are exported and announced as a WeightVersion."""
    needs_greedy_row: bool = False
    """Every prompt group must carry one greedily decoded sample (recorded temperature 0), e.g.
    ReMax's baseline: a batch without any is set aside, and a pipeline whose rollout samples
    none is refused at validation."""

    def slot(self, name: str) -> ModelSlot:
        for s in self.models:
            if s.name == name:
                return s
        raise RecipeError(f"no model slot {name!r}; slots are {[s.name for s in self.models]}")

    def validate(self) -> None:
        """Raise RecipeError listing every inconsistency at once."""
        errors: list[str] = []
        slots = {s.name for s in self.models}
        seen: list[str] = []
        for role in self.roles:
            errors += [f"role {role.name!r} uses unknown slot {m!r}" for m in role.models
                       if m not in slots]
            if role.name in seen:
                errors.append(f"role {role.name!r} is declared twice")
            seen.append(role.name)
        for s in self.models:
            if s.group not in self.groups:
                errors.append(f"slot {s.name!r} is in undeclared group {s.group!r}")
        for sync in self.syncs:
            if sync.source not in seen or sync.target not in seen:
                errors.append(f"sync {sync.source}->{sync.target}: unknown role")
            elif seen.index(sync.source) >= seen.index(sync.target):
                errors.append(f"sync {sync.source}->{sync.target}: source must run before target")
        if self.publish not in slots:
            errors.append(f"publish={self.publish!r} is not a slot")
        if errors:
            raise RecipeError("invalid recipe: " + "; ".join(errors))


def _load_builtin() -> None:
    import stacx.trainer.recipes  # noqa: F401  (registers the shipped recipes)


def _check(factory: Any) -> str | None:
    return accepts(factory)


RECIPES: Registry[Callable[[], TrainingConfig]] = Registry(
    "recipes", what="recipe", check=_check, load_builtin=_load_builtin
)
"""Recipe factories by name: `factory() -> TrainingConfig`; a dotted path or an entry point in
`stacx.recipes` names one from a user's package."""


def recipe(name: str) -> Callable[[Callable[[], TrainingConfig]], Callable[[], TrainingConfig]]:
    """Register a recipe factory; its docstring's first line is the description."""

    def register(factory: Callable[[], TrainingConfig]) -> Callable[[], TrainingConfig]:
        if RECIPES.is_registered(name):
            raise RecipeError(f"recipe {name!r} is registered twice")
        shipped = factory.__module__.startswith("stacx.trainer.recipes")
        RECIPES.add(name, factory, origin=f"{'builtin' if shipped else 'registered'} ({factory.__module__})")
        return factory

    return register


def get_recipe(ref: str) -> TrainingConfig:
    """A fresh, validated TrainingConfig of the recipe `ref` names (registered name, dotted path
    `package.module:factory`, or entry point)."""
    try:
        factory = RECIPES.resolve(ref)
    except PluginError as exc:
        raise RecipeError(str(exc)) from exc
    try:
        config = factory()
    except RecipeError:
        raise
    except Exception as exc:  # a user's factory: one line, not a traceback
        raise RecipeError(f"{ref!r}: building the recipe raised {first_line(exc)}") from exc
    if not isinstance(config, TrainingConfig):
        raise RecipeError(f"{ref!r}: the factory returned a {type(config).__name__}, not a TrainingConfig")
    if not config.description:
        doc = (factory.__doc__ or "").strip().splitlines()
        config.description = doc[0] if doc else ""
    config.validate()
    return config


def list_recipes() -> list[tuple[str, str]]:
    """(name, one-line description) of every registered recipe, sorted by name."""
    return [(info.name, info.summary) for info in RECIPES.available()]


def role_options_problems(config: TrainingConfig, ref: str, options: Mapping[str, Any]) -> list[str]:
    """Every problem of `role_options` against the options the recipe declares (the fields of
    each role's specialization), one line each with its path: an unknown role or option, a value
    of the wrong type, a value the specialization's own check refuses. Empty: they apply."""
    roles = {role.name: role for role in config.roles}
    lines = []
    for name, values in options.items():
        role = roles.get(name)
        if role is None:
            lines.append(f"role_options.{name}: recipe {ref!r} has no role {name!r} (its roles: "
                         f"{', '.join(sorted(roles))}){did_you_mean(name, sorted(roles))}")
        elif not isinstance(values, Mapping):
            lines.append(f"role_options.{name}: expected a mapping of options, got {values!r}")
        else:
            lines += _option_problems(role, ref, values)
    return lines


def _option_problems(role: Role, ref: str, values: Mapping[str, Any]) -> list[str]:
    spec: Any = role.specialization
    declared = _declared_options(type(spec))
    lines, typed = [], {}
    for option, value in values.items():
        where = f"role_options.{role.name}.{option}"
        if option not in declared:
            lines.append(f"{where}: recipe {ref!r} declares no such option for role {role.name} (its "
                         f"options: {', '.join(sorted(declared))}){did_you_mean(option, sorted(declared))}")
            continue
        try:
            typed[option] = pydantic.TypeAdapter(declared[option]).validate_python(value)
        except pydantic.ValidationError as exc:
            message = exc.errors()[0]["msg"].replace("Input should be", "expected").split(", unable to")[0]
            lines.append(f"{where}: {message}, got {value!r}")
    if not lines:
        try:
            dataclasses.replace(spec, **typed)
        except (TypeError, ValueError, RecipeError) as exc:  # the role's own check (validate)
            lines.append(f"role_options.{role.name}: {exc}")
    return lines


def _declared_options(cls: type[Any]) -> dict[str, Any]:
    """Option name -> its type (Any where the annotation does not resolve)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation naming something only a type checker imports
        hints = {}
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls) if f.init}
