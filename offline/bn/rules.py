"""YAML language for expert rules (if-then) and monotonicity queries on a BN classifier.

A spec file names rules whose premise constrains feature variables by state name or by
ordinal index, and whose conclusion is a class state, a set of them, or ``not`` a state;
optionally it declares the ordinal order of each variable's states (the class's too, which
monotonicity of an argmax classifier needs) and lists monotonicity queries. Every problem in a file is
reported at once (``ConfigError``), each naming the rule or query and the offending term.
See ``docs/rules.md`` for the language with examples.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.inputs import load_yaml_file, show_path
from boxwatch.offline.bn.limits import Deadline

MONOTONICITY_KINDS = ("fmo", "increasing", "decreasing")
_OPS = ("<=", ">=", "==", "!=", "<", ">")
# Linear: ``(.*)`` stops at a line end and gives back characters one by one, and only a
# ``]`` starts the (whitespace) scan to the end; operator and range terms are split by
# :func:`_split_operator` and :func:`_split_range` in one pass, not by backtracking regexes.
_IN = re.compile(r"^\s*in\s*\[(.*)\]\s*$", re.IGNORECASE)
MAX_INDEX_DIGITS = 18
"""Digits of a state index; more is out of every variable's range (and past Python's
int-string limit at 4,300 digits, which would raise)."""
MAX_SHOWN = 20
"""Names listed in a message (states, features) before the rest are counted."""


@dataclass(frozen=True)
class ClassifierSchema:
    """What a spec is checked against: features with their states, the class, other variables.

    Parameters
    ----------
    features : mapping of str to sequence of str
        Feature variables and their state names, in the network's (diagram's) state order.
    class_variable : str
        The class variable.
    class_states : sequence of str
        The class variable's state names (conclusions must be among them).
    other_variables : collection of str
        Network variables that are neither features nor the class (for precise errors).
    decision : {"threshold", "argmax"}
        The classifier's decision; an argmax classifier's monotonicity queries need the
        class's state order declared.
    """

    features: Mapping[str, Sequence[str]]
    class_variable: str
    class_states: Sequence[str]
    other_variables: Collection[str] = ()
    decision: str = "threshold"

    @classmethod
    def from_diagram(cls, diagram: Any, variables: Collection[str] = ()) -> ClassifierSchema:
        """Schema of a ``DecisionDiagram``; ``variables`` are all network variables, if known."""
        features = dict(zip(diagram.features, diagram.states, strict=True))
        others = [v for v in variables if v not in features and v != diagram.class_variable]
        return cls(
            features,
            diagram.class_variable,
            tuple(diagram.terminals),
            tuple(others),
            getattr(diagram, "decision", "threshold"),
        )


@dataclass(frozen=True)
class Rule:
    """An if-then rule: every input inside ``premise`` must be classified in ``conclusion``.

    ``premise`` maps a feature to the allowed state indices (network order, sorted);
    features absent from it are unconstrained. ``conclusion`` holds allowed class states.
    """

    name: str
    premise: dict[str, tuple[int, ...]]
    conclusion: tuple[str, ...]
    text: str = ""

    def to_dict(self, schema: ClassifierSchema | None = None) -> dict[str, Any]:
        """JSON-able form; with a schema, premise values are given as state names."""
        if schema is None:
            premise: dict[str, Any] = {k: list(v) for k, v in self.premise.items()}
        else:
            premise = {k: [schema.features[k][j] for j in v] for k, v in self.premise.items()}
        return {
            "name": self.name,
            "premise": premise,
            "conclusion": list(self.conclusion),
            "text": self.text,
        }


@dataclass(frozen=True)
class MonotonicityQuery:
    """Does the class move monotonically as ``feature`` rises through ``order``, given ``given``?

    ``kind`` is ``"fmo"`` (the class flips at most once: no H-L-H or L-H-L), ``"increasing"``
    (the positive class is never lost as the feature rises) or ``"decreasing"`` (never gained).
    ``order`` lists the feature's state indices from lowest to highest; ``given`` maps other
    features to their allowed state indices (a partial assignment when each is one value).

    For an argmax classifier ``class_order`` lists the class's state indices (sink ids) from
    lowest to highest, as declared; ``increasing`` then means the predicted state's rank never
    falls as the feature rises, ``decreasing`` that it never rises, and ``fmo`` that it never
    moves both ways (no rise then fall, no fall then rise).
    """

    name: str
    feature: str
    order: tuple[int, ...]
    given: dict[str, tuple[int, ...]]
    kind: str = "fmo"
    class_order: tuple[int, ...] | None = None

    def to_dict(self, schema: ClassifierSchema | None = None) -> dict[str, Any]:
        """JSON-able form; with a schema, values are given as state names."""
        if schema is None:
            given: dict[str, Any] = {k: list(v) for k, v in self.given.items()}
            order: list[Any] = list(self.order)
        else:
            given = {k: [schema.features[k][j] for j in v] for k, v in self.given.items()}
            order = [schema.features[self.feature][j] for j in self.order]
        out = {
            "name": self.name,
            "feature": self.feature,
            "kind": self.kind,
            "order": order,
            "given": given,
        }
        if self.class_order is not None:
            out["class_order"] = (
                list(self.class_order)
                if schema is None
                else [schema.class_states[t] for t in self.class_order]
            )
        return out


@dataclass
class Spec:
    """A parsed spec file: rules, monotonicity queries and the declared state orders."""

    rules: list[Rule] = field(default_factory=list)
    queries: list[MonotonicityQuery] = field(default_factory=list)
    state_order: dict[str, tuple[str, ...]] = field(default_factory=dict)


def load_spec(
    path: str | Path,
    schema: ClassifierSchema,
    *,
    default_order: Mapping[str, Sequence[str]] | None = None,
    deadline: Deadline | None = None,
) -> Spec:
    """Read and validate a YAML spec file; raise ``ConfigError`` listing every problem.

    ``default_order`` gives state orders (e.g. another file's ``states``) that this file's
    own ``states`` section extends or overrides. ``deadline`` is checked while the YAML is
    read (a 4 MiB file takes seconds).
    """
    path = Path(path)
    check = None
    if deadline is not None:
        where = show_path(path)

        def check() -> None:
            deadline.check(f"reading {where}")

    data = load_yaml_file(path, what="rules file", check=check)
    return parse_spec(data, schema, source=show_path(path), default_order=default_order)


def parse_spec(
    data: Any,
    schema: ClassifierSchema,
    *,
    source: str = "spec",
    default_order: Mapping[str, Sequence[str]] | None = None,
) -> Spec:
    """Validate a spec given as plain data (the YAML document); see :func:`load_spec`."""
    problems: list[str] = []
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the document must be a mapping with 'rules' and/or 'monotonicity'"
        )
    unknown = sorted(set(data) - {"class", "states", "rules", "monotonicity"})
    if unknown:
        problems.append(
            f"{source}: unknown top-level key(s) {unknown}; expected class, "
            "states, rules, monotonicity"
        )
    declared = data.get("class")
    if declared is not None and declared != schema.class_variable:
        problems.append(
            f"{source}: class {declared!r} does not match the classifier's class "
            f"variable {schema.class_variable!r}"
        )
    order = {k: list(v) for k, v in (default_order or {}).items()}
    order.update(_parse_states(data.get("states") or {}, schema, source, problems))
    ctx = _Context(schema, order, problems)
    rules = _parse_rules(data.get("rules") or [], ctx, source)
    queries = _parse_queries(data.get("monotonicity") or [], ctx, source)
    if problems:
        raise ConfigError(problems)
    return Spec(rules, queries, {k: tuple(v) for k, v in order.items()})


class _Names:
    """A variable's state names in one order, looked up by name in constant time."""

    def __init__(self, names: Sequence[str]):
        self.names = list(names)
        self.index: dict[str, int] = {}
        for j, name in enumerate(self.names):
            self.index.setdefault(name, j)
        self._spelled: dict[str, list[int]] | None = None

    def __len__(self) -> int:
        return len(self.names)

    def spelled(self, flag: bool) -> list[int]:
        """Positions of the states spelled ``true`` (or ``false``) in any case."""
        if self._spelled is None:
            self._spelled = {"true": [], "false": []}
            for j, name in enumerate(self.names):
                if name.lower() in self._spelled:
                    self._spelled[name.lower()].append(j)
        return self._spelled[str(flag).lower()]

    def shown(self) -> str:
        """The names for a message: the list, cut after :data:`MAX_SHOWN`."""
        return _shown_list(self.names)


def _shown_list(names: Sequence[str]) -> str:
    """``['a', 'b']``, or the first :data:`MAX_SHOWN` and how many there are."""
    if len(names) <= MAX_SHOWN:
        return str(list(names))
    return f"{str(list(names[:MAX_SHOWN]))[:-1]}, ...] ({len(names):,} states)"


def _echo(value: Any) -> str:
    """``repr`` of a term as written, cut when long (a condition may list a million states)."""
    text = repr(value)
    if len(text) > 200:
        return f"{text[:160]}... ({len(text):,} characters)"
    return text


@dataclass
class _Context:
    schema: ClassifierSchema
    order: dict[str, list[str]]
    problems: list[str]
    _names: dict[str, _Names] = field(default_factory=dict)
    _network: dict[str, _Names] = field(default_factory=dict)
    _others: set[str] | None = None

    def states(self, var: str) -> _Names:
        """States of a feature or of the class in declared ordinal order (made once)."""
        got = self._names.get(var)
        if got is None:
            if var in self.order:
                got = _Names(self.order[var])
            elif var == self.schema.class_variable:
                got = _Names(self.schema.class_states)
            else:
                got = _Names(self.schema.features[var])
            self._names[var] = got
        return got

    def network(self, var: str) -> _Names:
        """States of a feature (or of the class) in the network's order (made once)."""
        got = self._network.get(var)
        if got is None:
            s = self.schema
            got = _Names(s.class_states if var == s.class_variable else s.features[var])
            self._network[var] = got
        return got

    def check_variable(self, var: Any, where: str, *, allow_class: bool = False) -> bool:
        """Is ``var`` a feature (or the class when allowed)? Record a problem when not."""
        s = self.schema
        if var in s.features or (allow_class and var == s.class_variable):
            return True
        if self._others is None:
            self._others = set(s.other_variables)
        features = ", ".join(list(s.features)[:MAX_SHOWN])
        if len(s.features) > MAX_SHOWN:
            features += f", ... ({len(s.features):,} features)"
        if var == s.class_variable:
            self.problems.append(
                f"{where}: {var!r} is the class variable; a premise may only constrain features"
            )
        elif var in self._others:
            self.problems.append(
                f"{where}: {var!r} is a network variable but not a feature "
                f"of this classifier (features: {features})"
            )
        else:
            self.problems.append(f"{where}: unknown variable {_echo(var)} (features: {features})")
        return False


def _parse_states(
    raw: Any, schema: ClassifierSchema, source: str, problems: list[str]
) -> dict[str, list[str]]:
    """Declared ordinal orders: each must be a permutation of the variable's states."""
    if not isinstance(raw, dict):
        problems.append(f"{source}: 'states' must map variables to lists of state names")
        return {}
    order: dict[str, list[str]] = {}
    for var, names in raw.items():
        where = f"{source}: states of {var!r}"
        if var == schema.class_variable:
            actual = list(schema.class_states)
        elif var in schema.features:
            actual = list(schema.features[var])
        else:
            problems.append(f"{where}: not a feature or the class of this classifier")
            continue
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            problems.append(f"{where}: must be a list of state names")
            continue
        if sorted(names) != sorted(actual) or len(set(names)) != len(names):
            problems.append(
                f"{where}: {_shown_list(names)} must list each of its states "
                f"{_shown_list(actual)} exactly once"
            )
            continue
        order[var] = names
    return order


def _parse_rules(raw: Any, ctx: _Context, source: str) -> list[Rule]:
    if not isinstance(raw, list):
        ctx.problems.append(f"{source}: 'rules' must be a list of rules")
        return []
    rules: list[Rule] = []
    seen: set[str] = set()
    for k, item in enumerate(raw):
        name = item.get("name") if isinstance(item, dict) else None
        name = str(name) if name is not None else f"rule #{k + 1}"
        where = f"{source}: rule {name!r}"
        if not isinstance(item, dict):
            ctx.problems.append(f"{where}: must be a mapping with name, if, then")
            continue
        if name in seen:
            ctx.problems.append(f"{where}: duplicate rule name")
        seen.add(name)
        extra = sorted(set(item) - {"name", "if", "then", "description"})
        if extra:
            ctx.problems.append(
                f"{where}: unknown key(s) {extra}; expected name, if, then, description"
            )
        premise = _parse_constraints(item.get("if") or {}, ctx, where, "if")
        conclusion = _parse_conclusion(item.get("then"), ctx, where)
        if premise is not None and conclusion is not None:
            rules.append(Rule(name, premise, conclusion, _rule_text(item)))
    return rules


def _parse_queries(raw: Any, ctx: _Context, source: str) -> list[MonotonicityQuery]:
    if not isinstance(raw, list):
        ctx.problems.append(f"{source}: 'monotonicity' must be a list of queries")
        return []
    queries: list[MonotonicityQuery] = []
    for k, item in enumerate(raw):
        name = item.get("name") if isinstance(item, dict) else None
        name = str(name) if name is not None else f"query #{k + 1}"
        where = f"{source}: monotonicity query {name!r}"
        if not isinstance(item, dict):
            ctx.problems.append(f"{where}: must be a mapping with name, feature, given, check")
            continue
        extra = sorted(set(item) - {"name", "feature", "given", "check", "description"})
        if extra:
            ctx.problems.append(
                f"{where}: unknown key(s) {extra}; expected name, feature, "
                "given, check, description"
            )
        kind = item.get("check", "fmo")
        if kind not in MONOTONICITY_KINDS:
            ctx.problems.append(
                f"{where}: check {kind!r} must be one of {', '.join(MONOTONICITY_KINDS)}"
            )
        feature = item.get("feature")
        ok = feature is not None and ctx.check_variable(feature, f"{where}: feature")
        if feature is None:
            ctx.problems.append(f"{where}: 'feature' is required")
        given = _parse_constraints(item.get("given") or {}, ctx, where, "given")
        if ok and given is not None and feature in given:
            ctx.problems.append(
                f"{where}: given: the queried feature {feature!r} must not be constrained"
            )
            continue
        class_order = None
        if ctx.schema.decision == "argmax":
            cls = ctx.schema.class_variable
            if cls not in ctx.order:
                ctx.problems.append(
                    f"{where}: the classifier decides the most probable {cls} (argmax); "
                    f"declare the order of its states under 'states: {{{cls}: [...]}}', "
                    "lowest first"
                )
                continue
            terminals = ctx.network(cls).index
            class_order = tuple(terminals[s] for s in ctx.order[cls])
        if ok and feature is not None and given is not None and kind in MONOTONICITY_KINDS:
            network = ctx.network(feature).index
            order = tuple(network[s] for s in ctx.states(feature).names)
            queries.append(MonotonicityQuery(name, feature, order, given, kind, class_order))
    return queries


def _parse_constraints(
    raw: Any, ctx: _Context, where: str, key: str
) -> dict[str, tuple[int, ...]] | None:
    """Per-feature allowed state indices (network order); ``None`` when any term failed."""
    if not isinstance(raw, dict):
        ctx.problems.append(f"{where}: '{key}' must map features to conditions")
        return None
    out: dict[str, tuple[int, ...]] = {}
    ok = True
    for var, cond in raw.items():
        term = f"{where}: {key} {var}: {_echo(cond)}"
        if not ctx.check_variable(var, f"{where}: {key}"):
            ok = False
            continue
        positions = _parse_condition(cond, ctx.states(var), term, ctx.problems)
        if positions is None:
            ok = False
            continue
        ordered = ctx.states(var)
        if not positions:
            ctx.problems.append(
                f"{term}: allows no state of {var} (states in order: {ordered.shown()})"
            )
            ok = False
            continue
        network = ctx.network(var).index
        out[var] = tuple(sorted(network[ordered.names[p]] for p in positions))
    return out if ok else None


def _parse_conclusion(raw: Any, ctx: _Context, where: str) -> tuple[str, ...] | None:
    term = f"{where}: then {_echo(raw)}"
    if raw is None:
        ctx.problems.append(f"{where}: 'then' (the expected class state) is required")
        return None
    if isinstance(raw, dict) and list(raw) != ["not"]:
        if list(raw) != [ctx.schema.class_variable]:
            ctx.problems.append(
                f"{term}: must name a state of the class {ctx.schema.class_variable!r}, "
                "a list of them, or {not: state}"
            )
            return None
        raw = raw[ctx.schema.class_variable]
    states = ctx.states(ctx.schema.class_variable)
    negate = isinstance(raw, dict) and list(raw) == ["not"]
    if negate:
        raw = raw["not"]
    positions = _parse_condition(raw, states, term, ctx.problems)
    if positions is None:
        return None
    if negate:
        positions = set(range(len(states))) - positions
    if not positions:
        ctx.problems.append(f"{term}: allows no class state")
        return None
    return tuple(states.names[p] for p in sorted(positions))


def _parse_condition(cond: Any, states: _Names, term: str, problems: list[str]) -> set[int] | None:
    """Positions (in ``states``' ordinal order) a condition allows; ``None`` on error."""
    n = len(states)
    if isinstance(cond, bool) and _value(cond, states) is None:
        problems.append(
            f"{term}: expected a state, an index or a condition, not a boolean "
            f"(states in order: {states.shown()})"
        )
        return None
    if isinstance(cond, int | str) and (index := _value(cond, states)) is not None:
        return {index}
    if isinstance(cond, list):
        return _parse_values(cond, states, term, problems)
    if isinstance(cond, dict):
        allowed = set(range(n))
        ok = True
        for op, operand in cond.items():
            sub = _parse_op(str(op), operand, states, term, problems)
            if sub is None:
                ok = False
            else:
                allowed &= sub
        return allowed if ok else None
    if isinstance(cond, str):
        text = cond.strip()
        m = _IN.match(text)
        if m:
            items = [s.strip() for s in m.group(1).split(",") if s.strip()]
            return _parse_values(items, states, term, problems)
        if " and " in text:
            allowed = set(range(n))
            for part in text.split(" and "):
                sub = _parse_condition(part.strip(), states, term, problems)
                if sub is None:
                    return None
                allowed &= sub
            return allowed
        op_term = _split_operator(text)
        if op_term:
            return _parse_op(*op_term, states, term, problems)
        bounds = _split_range(text)
        if bounds:
            lo, hi = _value(bounds[0], states), _value(bounds[1], states)
            if lo is None or hi is None:
                bad = bounds[0] if lo is None else bounds[1]
                problems.append(f"{term}: {_unknown(bad, states)}")
                return None
            return set(range(lo, hi + 1))
    problems.append(
        f"{term}: unknown state or index, or not a condition (states in order: "
        f"{states.shown()}; conditions: a state, an index, '<= 2', 'in [a, b]', '1..2')"
    )
    return None


def _split_operator(text: str) -> tuple[str, str] | None:
    """``("<=", "2")`` for ``"<= 2"``: an operator of :data:`_OPS` and its operand (stripped,
    on one line); ``None`` when ``text`` is no such term. One pass, no backtracking."""
    body = text.lstrip()
    for op in _OPS:
        if body.startswith(op):
            rest = body[len(op) :]
            operand = rest.strip()
            if operand and "\n" not in operand:
                return op, operand
            if not operand and rest.strip("\n"):  # blanks only: an empty operand
                return op, ""
    return None


def _split_range(text: str) -> tuple[str, str] | None:
    """``("a1", "a3")`` for ``"a1 .. a3"`` (``text`` stripped): the bounds around the first
    ``..`` that has one on each side, each on one line; ``None`` when there is none.

    Linear: each ``..`` is found once, and the whitespace runs scanned around different
    ones are disjoint.
    """
    first_newline, last_newline = text.find("\n"), text.rfind("\n")
    at = text.find("..", 1)
    while at > 0:
        end = at
        while end > 0 and text[end - 1].isspace():
            end -= 1
        if 0 <= first_newline < end:
            return None
        start = at + 2
        while start < len(text) and text[start].isspace():
            start += 1
        if start < len(text) and last_newline < start:
            return text[:end], text[start:]
        at = text.find("..", at + 1)
    return None


def _parse_op(
    op: str, operand: Any, states: _Names, term: str, problems: list[str]
) -> set[int] | None:
    if op == "in":
        if not isinstance(operand, list):
            problems.append(f"{term}: 'in' needs a list")
            return None
        return _parse_values(operand, states, term, problems)
    if op not in _OPS:
        problems.append(f"{term}: unknown operator {op!r} (use {', '.join(_OPS)}, in)")
        return None
    v = _value(operand, states)
    if v is None:
        problems.append(f"{term}: {_unknown(operand, states)}")
        return None
    idx = range(len(states))
    tests = {
        "<=": lambda j: j <= v,
        "<": lambda j: j < v,
        ">=": lambda j: j >= v,
        ">": lambda j: j > v,
        "==": lambda j: j == v,
        "!=": lambda j: j != v,
    }
    return {j for j in idx if tests[op](j)}


def _parse_values(
    items: list[Any], states: _Names, term: str, problems: list[str]
) -> set[int] | None:
    out: set[int] = set()
    for item in items:
        v = _value(item, states)
        if v is None:
            problems.append(f"{term}: {_unknown(item, states)}")
            return None
        out.add(v)
    return out


def _unknown(token: Any, states: _Names) -> str:
    """Why ``token`` names no state: an index out of range, or an unknown name."""
    text = str(token).strip()
    if _is_index(text):
        shown = text if len(text) <= 40 else f"{text[:20]}... ({len(text):,} digits)"
        return (
            f"index {shown} is out of range 0..{len(states) - 1} "
            f"(states in order: {states.shown()})"
        )
    return f"unknown state {_echo(text)} (states in order: {states.shown()})"


def _is_index(text: str) -> bool:
    """Whether ``text`` is a state index: ASCII digits (``\\d`` and ``int`` take others)."""
    return text.isascii() and text.isdigit()


def _value(token: Any, states: _Names) -> int | None:
    """Ordinal position of a state name or index token; ``None`` when it names neither.

    A string equal to a state name means that state; otherwise an integer (YAML int or a
    string of ASCII digits) means the ordinal index. A YAML boolean names the state spelled
    ``true``/``false`` in any case (networks with TRUE/FALSE states).
    """
    if isinstance(token, bool):
        named = states.spelled(token)
        return named[0] if len(named) == 1 else None
    if isinstance(token, str):
        text = token.strip()
        if text in states.index:
            return states.index[text]
        if not _is_index(text) or len(text) > MAX_INDEX_DIGITS:
            return None
        token = int(text)
    if isinstance(token, int) and 0 <= token < len(states):
        return token
    return None


def _rule_text(item: dict[str, Any]) -> str:
    """One-line human rendering of a rule as written: ``if A: > 0, B: low then Positive``."""
    cond = ", ".join(f"{k} {_cond_text(v)}" for k, v in (item.get("if") or {}).items())
    then = item.get("then")
    if isinstance(then, dict) and list(then) == ["not"]:
        then = f"not {_cond_text(then['not']).removeprefix('= ')}"
    elif isinstance(then, list):
        then = "[" + ", ".join(str(t) for t in then) + "]"
    return f"if {cond or 'anything'} then {then}"


def _cond_text(cond: Any) -> str:
    if isinstance(cond, str) and _split_operator(cond):
        return cond.strip()
    if isinstance(cond, list):
        return "in [" + ", ".join(str(c) for c in cond) + "]"
    if isinstance(cond, dict):
        return " and ".join(f"{k} {v}" for k, v in cond.items())
    return f"= {cond}"
