"""Validated configuration: the base class of every rlcoach config, and its errors.

A config is a small pydantic model (`extra="forbid"`) validated once. However it is
built — `TrainConfig(learning_rate=-1)`, `TrainConfig.model_validate({...})`, from JSON,
a dict handed to `TrainableModel(config=...)`, an assignment — a bad value raises
`ConfigError`, never pydantic's `ValidationError`, and the message names the field, the
bad value, the reason and the fix: the allowed range of a bounded number, the choices of
a literal, the closest field name for a misspelt one. Messages from a config's own
validators are kept as they are (they already say all four).

Data records — trajectories, choices, groups, chat records — are validated the same way
(`Record`): built wrongly, they raise `DataError` with the same kind of message. Both
are subclasses of the standard `ValueError` that pydantic's error is, so a caller that
catches `ValueError` keeps working.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any, ClassVar

import annotated_types
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from rlcoach.errors import ConfigError, DataError, RLCoachError

__all__ = ["Config", "Record", "config_error"]

_COMPARISONS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


class _Validated(BaseModel):
    """A model whose every way of being built raises `_error_class`, not pydantic's
    `ValidationError`, with a message that names the field, the value, the reason and
    the fix."""

    _error_class: ClassVar[type[RLCoachError]] = ConfigError

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise config_error(type(self), e, self._error_class) from e

    # Pydantic calls a model's own __init__ for every validation (nested fields and
    # model_validate included) unless marked as its base one; this one only translates
    # the error, so it is marked (as pydantic's RootModel does) and nested configs are
    # validated by pydantic alone: one error, located from the outermost config.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> typing.Self:
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as e:
            raise config_error(cls, e, cls._error_class) from e

    @classmethod
    def model_validate_json(cls, json_data: Any, *args: Any, **kwargs: Any) -> typing.Self:
        try:
            return super().model_validate_json(json_data, *args, **kwargs)
        except ValidationError as e:
            raise config_error(cls, e, cls._error_class) from e

    @classmethod
    def model_validate_strings(cls, obj: Any, *args: Any, **kwargs: Any) -> typing.Self:
        try:
            return super().model_validate_strings(obj, *args, **kwargs)
        except ValidationError as e:
            raise config_error(cls, e, cls._error_class) from e

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as e:  # a frozen config, or validate_assignment
            raise config_error(type(self), e, self._error_class) from e
        except ValueError as e:  # pydantic: '"X" object has no field "y"'
            if isinstance(e, RLCoachError):
                raise
            raise self._error_class(
                f"{type(self).__name__}.{name}={_show(value)}: {e}; fix: "
                f"{_field_hint(name, type(self))}"
            ) from e


class Config(_Validated):
    """A configuration model whose every way of being built raises `ConfigError`."""

    model_config = ConfigDict(extra="forbid")


class Record(_Validated):
    """A data record (a trajectory, a choice, a group): built wrongly, `DataError`."""

    _error_class: ClassVar[type[RLCoachError]] = DataError


def config_error(
    cls: type[BaseModel], error: ValidationError, kind: type[RLCoachError] = ConfigError
) -> RLCoachError:
    """`error` (pydantic's, from validating `cls`) as one `kind` error (a `ConfigError`
    unless a record's `DataError`) naming each field, its bad value, the reason and the
    fix."""
    problems = [_problem(cls, details) for details in error.errors(include_url=False)]
    head = f"invalid {cls.__name__}: " if len(problems) > 1 else ""
    return kind(head + "; ".join(problems))


def _problem(cls: type[BaseModel], details: ErrorDetails) -> str:
    location = ".".join(str(part) for part in details["loc"])
    where = f"{cls.__name__}.{location}" if location else cls.__name__
    kind, message = details["type"], details["msg"]
    owner, field = _field_at(cls, details["loc"])
    value = _show(details.get("input"))
    if kind == "missing":
        return f"{where} is required and was not given; fix: pass {details['loc'][-1]}=..."
    if kind == "extra_forbidden":
        name = str(details["loc"][-1])
        return (
            f"{where}={value}: {owner.__name__} has no field {name!r}; "
            f"fix: {_field_hint(name, owner)}"
        )
    if kind == "frozen_instance":
        return (
            f"{where}: {cls.__name__} is frozen (validated once); fix: build a new one, "
            "e.g. config.model_copy(update={...}) or a fresh constructor call"
        )
    if kind in ("value_error", "assertion_error"):
        reason = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        fix = "" if "fix" in reason else "; fix: change the value as the reason says"
        return f"{where}{'=' + value if location else ''}: {reason}{fix}"
    return f"{where}={value}: {message}; fix: {_fix(kind, message, details, field)}"


def _fix(kind: str, message: str, details: ErrorDetails, field: FieldInfo | None) -> str:
    if kind in _COMPARISONS and field is not None and (bounds := _bounds(field)):
        return f"use a number {bounds}"
    if kind == "literal_error" and "expected" in details.get("ctx", {}):
        return f"use one of {details['ctx']['expected']}"
    wanted = message.removeprefix("Input should be ").split(", unable to")[0]
    if wanted == message:
        return "see the field's documentation"
    return f"pass {wanted}" if wanted.startswith(("a ", "an ")) else f"make it {wanted}"


def _bounds(field: FieldInfo) -> str:
    """The field's numeric constraints in words: 'greater than 0 and at most 1'."""
    words = []
    for rule in field.metadata:
        for attribute, phrase in (
            ("gt", "greater than"),
            ("ge", "at least"),
            ("lt", "less than"),
            ("le", "at most"),
        ):
            limit = getattr(rule, attribute, None)
            if isinstance(rule, annotated_types.BaseMetadata) and limit is not None:
                words.append(f"{phrase} {limit}")
    return " and ".join(words)


def _field_at(
    cls: type[BaseModel], location: tuple[int | str, ...]
) -> tuple[type[BaseModel], FieldInfo | None]:
    """The model that holds the field at `location`, and that field's info."""
    owner: type[BaseModel] = cls
    field: FieldInfo | None = None
    for index, part in enumerate(location):
        if not isinstance(part, str) or part not in owner.model_fields:
            break
        field = owner.model_fields[part]
        inner = _model_in(field.annotation)
        if inner is None or index == len(location) - 1:
            break
        owner, field = inner, None
    return owner, field


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        for argument in typing.get_args(annotation):
            if (found := _model_in(argument)) is not None:
                return found
    return None


def _field_hint(name: str, owner: type[BaseModel]) -> str:
    fields = sorted(owner.model_fields)
    close = difflib.get_close_matches(name, fields, n=1)
    guess = f"did you mean {close[0]!r}? " if close else ""
    return f"{guess}remove it, or use one of its fields: {', '.join(fields)}"


def _show(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."
