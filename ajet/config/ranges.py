"""Declared ranges and finite floats: every float setting must be finite, and every value
must lie in the range its schema field declares (`bounded`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import TYPE_CHECKING, TypeVar

from annotated_types import Ge, Gt, Interval

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
Range = Ge | Gt | Interval


def bounded(default: T, constraint: Range) -> T:
    """A field whose allowed range is declared here, with pydantic's constraint types
    (`Field(ge=0)` builds `Ge(0)`). `range_problems` checks every declared range, and that
    every float setting is finite, at load time."""
    return field(default=default, metadata={"range": constraint})


def range_problems(node: DataclassInstance | type[DataclassInstance], prefix: str = "") -> list[tuple[str, str]]:
    """Every float setting must be finite (inf/nan would pass a `>= 0` check: a temperature
    of inf makes sampling uniform), and every value must lie in the range its schema field
    declares (`bounded`). Walks nested sections and named sub-configs."""
    problems: list[tuple[str, str]] = []
    for f in dataclasses.fields(node):
        key, value = f"{prefix}{f.name}", getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            problems += range_problems(value, key + ".")
            continue
        if isinstance(value, dict):
            for name, item in value.items():
                if dataclasses.is_dataclass(item):
                    problems += range_problems(item, f"{key}.{name}.")
                elif _non_finite(item):
                    problems.append((f"{key}.{name}", f"must be a finite number, got {item}"))
            continue
        if _non_finite(value):
            problems.append((key, f"must be a finite number, got {value}"))
            continue
        bounds = f.metadata.get("range")
        if bounds is not None and value is not None and not _within(value, bounds):
            problems.append((key, f"must be {_describe(bounds)}, got {value}"))
    return problems


def _non_finite(value: object) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _limits(bounds: Range) -> dict[str, float]:
    return {k: v for k in ("gt", "ge", "lt", "le") if (v := getattr(bounds, k, None)) is not None}


def _within(value: float, bounds: Range) -> bool:
    limits = _limits(bounds)
    return all((
        value > limits.get("gt", -math.inf), value >= limits.get("ge", -math.inf),
        value < limits.get("lt", math.inf), value <= limits.get("le", math.inf),
    ))


def _describe(bounds: Range) -> str:
    limits = _limits(bounds)
    low = ("(", limits["gt"]) if "gt" in limits else ("[", limits["ge"]) if "ge" in limits else None
    high = (")", limits["lt"]) if "lt" in limits else ("]", limits["le"]) if "le" in limits else None
    if low and high:
        return f"in {low[0]}{low[1]}, {high[1]}{high[0]}"
    if low:
        return f"{'>' if low[0] == '(' else '>='} {low[1]}"
    assert high is not None  # a declared range has at least one limit
    return f"{'<' if high[0] == ')' else '<='} {high[1]}"
