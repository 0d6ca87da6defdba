"""Parameter domains, declared once: estimators validate against them and configs get their
JSON schema from them.

An estimator declares ``_parameter_constraints = {name: [constraint, ...]}`` (scikit-learn's
convention); a value is valid when it satisfies one constraint of its list, ``None`` in a
list allows ``None``. :func:`validate_params` reports every bad value at once, with the
value shown; :func:`json_schema` gives the fragment of a config that spells the same domain.
These are this project's constraint objects, not scikit-learn's: ``BaseEstimator`` reads
the same attribute name only in ``_validate_params``, which no monitor calls.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

Closed = Literal["both", "left", "right", "neither"]
# Seeds numpy's RandomState takes (sklearn.utils.check_random_state passes ints on to it).
MAX_SEED = 2**32 - 1
# How much of a shown value a message keeps.
SHOWN_CHARS = 80


class Constraint(ABC):
    """One set of values a parameter may take."""

    @abstractmethod
    def is_satisfied_by(self, value: Any) -> bool:
        """Whether ``value`` lies in the set (never raises)."""

    @abstractmethod
    def describe(self) -> str:
        """The set in words, after "should be" (``a float in (0, 1)``)."""

    @abstractmethod
    def json_schema(self) -> dict[str, Any] | None:
        """The JSON-schema fragment of the set's values a config can spell (None: none)."""


def _is_number(value: Any, kind: type) -> bool:
    """``value`` is a ``kind`` (Integral or Real) and not a bool, which Python counts as an int."""
    return isinstance(value, kind) and not isinstance(value, bool | np.bool_)


def _bound(value: float) -> str:
    """A bound as written in an interval: ``0``, ``0.5``."""
    return str(int(value)) if float(value).is_integer() else str(value)


class Interval(Constraint):
    """Ints (``kind=numbers.Integral``) or floats (``numbers.Real``) between optional bounds,
    each end open or closed (``closed``: ``"both"``, ``"left"``, ``"right"``, ``"neither"``)."""

    def __init__(
        self,
        kind: type,
        left: float | None,
        right: float | None,
        *,
        closed: Closed,
    ):
        self.kind, self.left, self.right, self.closed = kind, left, right, closed

    def _left_closed(self) -> bool:
        return self.closed in ("both", "left")

    def _right_closed(self) -> bool:
        return self.closed in ("both", "right")

    def contains(self, value: Any) -> bool:
        """Whether the number ``value`` lies between the bounds (its kind unchecked)."""
        v = float(value)
        if math.isnan(v):
            return False
        if self.left is not None and (
            v < self.left or (v == self.left and not self._left_closed())
        ):
            return False
        return self.right is None or not (
            v > self.right or (v == self.right and not self._right_closed())
        )

    def is_satisfied_by(self, value: Any) -> bool:
        return _is_number(value, self.kind) and self.contains(value)

    def range_text(self) -> str:
        """The bounds in words: ``in (0, 1]``, ``>= 1``, or empty when there are none."""
        if self.left is not None and self.right is not None:
            return (
                f"in {'[' if self._left_closed() else '('}{_bound(self.left)}, "
                f"{_bound(self.right)}{']' if self._right_closed() else ')'}"
            )
        if self.left is not None:
            return f"{'>=' if self._left_closed() else '>'} {_bound(self.left)}"
        if self.right is not None:
            return f"{'<=' if self._right_closed() else '<'} {_bound(self.right)}"
        return ""

    def describe(self) -> str:
        what = "an int" if self.kind is numbers.Integral else "a float"
        return f"{what} {self.range_text()}".rstrip()

    def json_schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "integer" if self.kind is numbers.Integral else "number"}
        if self.left is not None:
            out["minimum" if self._left_closed() else "exclusiveMinimum"] = self.left
        if self.right is not None:
            out["maximum" if self._right_closed() else "exclusiveMaximum"] = self.right
        return out


class Options(Constraint):
    """One of a few strings, in the given order (a vocabulary of :mod:`boxwatch.agent.vocab`)."""

    def __init__(self, options: Sequence[str]):
        self.options = tuple(options)

    def is_satisfied_by(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.options

    def describe(self) -> str:
        shown = ", ".join(repr(o) for o in self.options)
        return shown if len(self.options) == 1 else f"one of {shown}"

    def json_schema(self) -> dict[str, Any]:
        if len(self.options) == 1:
            return {"const": self.options[0]}
        return {"enum": list(self.options)}


class Boolean(Constraint):
    """``True`` or ``False`` (numpy's booleans too; not 0 or 1)."""

    def is_satisfied_by(self, value: Any) -> bool:
        return isinstance(value, bool | np.bool_)

    def describe(self) -> str:
        return "a bool"

    def json_schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


def _is_list(value: Any) -> bool:
    """A list or tuple (a string is not a list of its characters)."""
    return isinstance(value, list | tuple)


class Names(Constraint):
    """A non-empty list of distinct, non-empty names (layers, classes)."""

    def is_satisfied_by(self, value: Any) -> bool:
        return (
            _is_list(value)
            and len(value) > 0
            and all(isinstance(v, str) and v for v in value)
            and len(set(value)) == len(value)
        )

    def describe(self) -> str:
        return "a non-empty list of distinct names"

    def json_schema(self) -> dict[str, Any]:
        return {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "minItems": 1,
            "uniqueItems": True,
        }


class Numbers(Constraint):
    """A non-empty list (or 1-d array) of numbers, each in ``interval``."""

    def __init__(self, interval: Interval):
        self.interval = interval

    def is_satisfied_by(self, value: Any) -> bool:
        if isinstance(value, np.ndarray):
            value = value.tolist() if value.ndim == 1 else None
        return (
            _is_list(value)
            and len(value) > 0
            and all(self.interval.is_satisfied_by(v) for v in value)
        )

    def describe(self) -> str:
        what = "ints" if self.interval.kind is numbers.Integral else "floats"
        return f"a non-empty list of {what} {self.interval.range_text()}".rstrip()

    def json_schema(self) -> dict[str, Any]:
        return {"type": "array", "items": self.interval.json_schema(), "minItems": 1}


class PerName(Constraint):
    """A mapping of names to values that satisfy one of ``values`` (tau per layer)."""

    def __init__(self, values: Sequence[Constraint], *, key: str = "name"):
        self.values, self.key = tuple(values), key

    def is_satisfied_by(self, value: Any) -> bool:
        return isinstance(value, Mapping) and all(
            isinstance(k, str) and any(c.is_satisfied_by(v) for c in self.values)
            for k, v in value.items()
        )

    def describe(self) -> str:
        return f"a mapping {{{self.key}: {_alternatives(c.describe() for c in self.values)}}}"

    def json_schema(self) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": json_schema(self.values)}


class RandomStates(Constraint):
    """A seed numpy's ``RandomState`` takes (an int in [0, 2**32 - 1]) or a ``RandomState``."""

    seeds = Interval(numbers.Integral, 0, MAX_SEED, closed="both")

    def is_satisfied_by(self, value: Any) -> bool:
        return self.seeds.is_satisfied_by(value) or isinstance(value, np.random.RandomState)

    def describe(self) -> str:
        return f"{self.seeds.describe()} or a numpy RandomState"

    def json_schema(self) -> dict[str, Any]:
        return self.seeds.json_schema()


def _alternatives(words: Any) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    items = list(words)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def show(value: Any) -> str:
    """A value as a message shows it: strings quoted, numpy scalars as plain numbers, lists
    (and arrays) element by element, capped at :data:`SHOWN_CHARS` characters."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, np.ndarray):
        text = f"array({show(value.tolist())})"
    elif _is_list(value):
        text = "[" + ", ".join(show(v) for v in value) + "]"
    else:
        text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def describe(constraints: Sequence[Constraint | None]) -> str:
    """A parameter's domain in words: ``a float in [0, 1], a mapping ... or 'auto'``."""
    return _alternatives("None" if c is None else c.describe() for c in constraints)


def validate_params(
    constraints: Mapping[str, Sequence[Constraint | None]], params: Mapping[str, Any]
) -> dict[str, str]:
    """Every parameter of ``params`` outside its declared domain, as ``{name: problem}`` in
    the order of ``constraints`` (empty when all are valid); a name with no declared domain
    is a problem too.

    A problem shows the value and the domain: ``target_acceptance=1.5 should be a float in
    (0, 1)``.
    """
    problems: dict[str, str] = {}
    order = [name for name in constraints if name in params]
    for name in order + [name for name in params if name not in constraints]:
        value = params[name]
        if name not in constraints:
            problems[name] = f"{name}={show(value)}: no such parameter"
            continue
        allowed = constraints[name]
        if any(value is None if c is None else c.is_satisfied_by(value) for c in allowed):
            continue
        problems[name] = f"{name}={show(value)} should be {describe(allowed)}"
    return problems


def json_schema(constraints: Sequence[Constraint | None]) -> dict[str, Any]:
    """The JSON-schema fragment of a parameter's domain as a config spells it.

    ``None`` and values no config can hold (a ``RandomState``) are left out: a config
    omits the key to get the default. Several alternatives make a ``oneOf``; the
    alternatives of one parameter are disjoint (a list of names or ``"auto"``), so exactly
    one of them matches a valid value.
    """
    fragments = [f for c in constraints if c is not None and (f := c.json_schema()) is not None]
    if not fragments:
        raise ValueError(f"no config form for {describe(constraints)}")
    return fragments[0] if len(fragments) == 1 else {"oneOf": fragments}
