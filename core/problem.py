"""Problem conventions: frozen dataclasses, validated on construction.

A problem type is any frozen dataclass whose ``__post_init__`` validates its
fields with :mod:`core.validation`. Fields hold numbers, strings and NumPy
arrays only, never callables, so problems pickle to worker processes and Dask
clusters. This module turns loose parameters (from the CLI or a sweep) into
a problem of a given type.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from core.errors import ProblemError


class UnknownParameterError(ProblemError):
    """A parameter name that the problem type does not have."""


def parameter_types(problem_type: type) -> dict[str, Any]:
    """Field name -> annotated type of a problem dataclass."""
    hints = typing.get_type_hints(problem_type)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(problem_type) if f.init}


def make_problem(problem_type: type, params: Mapping[str, Any] | None = None, *,
                 base: Any = None) -> Any:
    """Build ``problem_type(**params)``, converting strings to each field's type.

    ``base`` is an existing problem whose other fields are kept, so a user can
    change one knob of a default problem. Unknown names raise
    :class:`UnknownParameterError` listing the valid ones.
    """
    values = convert_params(problem_type, params)
    if base is not None:
        return dataclasses.replace(base, **values)
    return problem_type(**values)


def convert_params(problem_type: type, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check the names against the problem's fields and convert text values to their types."""
    types = parameter_types(problem_type)
    params = dict(params or {})
    unknown = sorted(set(params) - set(types))
    if unknown:
        raise UnknownParameterError(
            f"unknown parameter {unknown[0]!r} for {problem_type.__name__}; "
            f"valid parameters: {', '.join(types)}")
    return {name: _convert(name, value, types[name]) for name, value in params.items()}


# what a text value must look like, in the words core.validation uses for the same field
_EXPECTED = {int: "must be an integer", float: "must be a finite number", bool: "must be true or false"}
_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _convert(name: str, value: Any, annotation: Any) -> Any:
    """Convert CLI text to the field's scalar type; other values pass through.

    Text that does not parse is passed on unchanged where the field also takes
    text (``bandwidth: float | str``), so the field's own validator names the
    choices; otherwise it is refused here in the validators' words.
    """
    if not isinstance(value, str):
        return value
    target = _scalar_type(annotation)
    if value.lower() == "none" and _allows_none(annotation):
        return None
    if target is None or target is str:
        return value
    try:
        if target is int:
            text = value.replace("_", "")
            try:
                return int(text)  # exact, even beyond 2**53 (seeds)
            except ValueError:
                number = float(text)  # accept "1e6" for sizes
                return int(number) if number.is_integer() else number
        if target is float:
            return float(value)
        if target is bool:
            return _BOOLEANS[value.lower()]
    except (ValueError, KeyError, OverflowError):
        if str in typing.get_args(annotation):
            return value
        raise ProblemError(f"{name}={value!r} is invalid: {_EXPECTED[target]}") from None
    return value


def _scalar_type(annotation: Any) -> type | None:
    if annotation in (int, float, str, bool):
        return annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    for candidate in (bool, int, float, str):
        if candidate in args:
            return candidate
    return None


def _allows_none(annotation: Any) -> bool:
    return type(None) in typing.get_args(annotation)
