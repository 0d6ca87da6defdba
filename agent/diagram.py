"""The runtime decision diagram: an exact, canonical ordered multi-valued decision diagram (MDD).

A Bayesian-network classifier compiled offline (:mod:`boxwatch.offline.bn.compile`) becomes
one :class:`DecisionDiagram`; the agent evaluates it on every record with a few vectorised
gathers per level, counts models on it, and (de)serialises it as artifact members.

Representation
--------------
* ``features[i]`` is the variable tested at level ``i`` (the variable order);
  ``states[i][j]`` names value index ``j`` of that feature.
* Node ids ``0 .. n_terminals-1`` are sinks (``terminals[t]`` is the label of sink ``t``);
  internal node ``k`` has id ``n_terminals + k``, tests level ``node_level[k]`` and goes to
  ``node_children[k, j]`` on value ``j`` (``-1`` beyond the level's cardinality).
* Sinks are class states, not booleans. For a threshold decision
  ``P(C = positive | x) >= threshold`` on a binary class variable the terminals are the two
  class states in the network's (BIF) order; on a class variable with more states they are
  ``(f"not {positive}", positive)``. An argmax (multi-class) diagram lists every class state
  in the network's order, so sink ``t`` is class state index ``t``; it has no positive state
  and no threshold (both ``None``).

Canonical form: reduced (no internal node whose children are all equal, no two nodes with the
same level and children; edges may skip levels) and numbered by level ascending, within a
level by first discovery in a breadth-first search from the root that visits children in
value order. Two diagrams of the same function and variable order are therefore equal array
for array (``==`` compares them that way). :meth:`DecisionDiagram.canonical` builds this
form from any, possibly unreduced, node table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeGuard

import numpy as np

from boxwatch.agent.errors import ArtifactError, BoxwatchError
from boxwatch.agent.members import DIAGRAM_JSON, DIAGRAM_NPZ, DIAGRAM_PREFIX

SCHEMA = "boxwatch.bn-diagram"
THRESHOLD, ARGMAX = "threshold", "argmax"
DECISIONS = (THRESHOLD, ARGMAX)
DECISION_TEXT = {
    THRESHOLD: "P(class_variable = positive | features) >= threshold",
    ARGMAX: "argmax over states c of P(class_variable = c | features); ties to the lowest "
    "state index",
}
SCHEMA_VERSION = 1


class RecordError(BoxwatchError, ValueError):
    """A record cannot be encoded: it names a variable that is no feature, lacks a feature
    or names an unknown state; ``reason`` is the dead-letter reason for it."""

    def __init__(
        self,
        message: str,
        *,
        record: int,
        variable: str,
        state: Any = None,
        reason: str = "unknown_state",
    ):
        self.record = record
        self.variable = variable
        self.state = state
        self.reason = reason
        super().__init__(message)


def state_indices(
    evidence: Mapping[str, Any],
    features: Sequence[str],
    state_index: Sequence[Mapping[str, int]],
    *,
    record: int = 0,
) -> np.ndarray:
    """One BN record ``{feature: state name}`` as state indices in ``features`` order.

    The one mapping of records to states: the agent's record decoder and
    :meth:`DecisionDiagram.encode` both use it. Every feature must be given, and nothing
    else: a variable that is not a feature is an error, not silently dropped.

    Raises
    ------
    RecordError
        With ``reason`` ``unknown_variable``, ``missing_evidence`` or ``unknown_state``
        (checked in that order), naming the variable (and state).
    """
    out = np.empty(len(features), dtype=np.int64)
    try:
        for i, (feature, index) in enumerate(zip(features, state_index, strict=True)):
            out[i] = index[evidence[feature]]
        if len(evidence) == len(features):
            return out
    except (KeyError, TypeError):
        pass
    known = set(features)
    unknown = sorted(str(k) for k in evidence if k not in known)
    if unknown:
        raise RecordError(
            f"{unknown[:5]} not features of the classifier",
            record=record,
            variable=unknown[0],
            reason="unknown_variable",
        )
    missing = [f for f in features if f not in evidence]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise RecordError(
            f"feature {missing[0]!r} is missing{more}",
            record=record,
            variable=missing[0],
            reason="missing_evidence",
        )
    for feature, index in zip(features, state_index, strict=True):
        state = evidence[feature]
        try:
            known_state = state in index
        except TypeError:
            known_state = False
        if not known_state:
            raise RecordError(
                f"feature {feature!r} has state {state!r}, not one of {list(index)}",
                record=record,
                variable=feature,
                state=state,
            )
    raise AssertionError("unreachable: every state is known")  # pragma: no cover


@dataclass(frozen=True, eq=False)
class DecisionDiagram:
    """An exact, canonical ordered MDD over discrete features with class-state sinks.

    Parameters
    ----------
    features : tuple of str, length n_features
        Level ``i`` tests ``features[i]``.
    states : tuple of tuple of str, length n_features
        State names per feature; value index ``j`` of level ``i`` means ``states[i][j]``.
    terminals : tuple of str, length n_terminals
        Sink labels (class states); sink id ``t`` means ``terminals[t]``.
    node_level : ndarray of shape (n_internal,), int32
        Level of each internal node.
    node_children : ndarray of shape (n_internal, max_card), int32
        Child node ids; ``-1`` beyond the level's cardinality.
    root : int
        Root node id (a sink id when the classifier is constant).
    class_variable : str
    positive : str or None
        The positive state (``positive in terminals``); ``None`` for an argmax diagram.
    threshold : float or None
        Decide ``positive`` iff ``P(class_variable = positive | x) >= threshold``; ``None``
        for an argmax diagram. The compiler decides this exactly: the threshold as its
        shortest decimal (``repr``, what ``diagram.json`` holds), the CPT numbers as the
        network file writes them (docs/exactness.md).
    decision : {"threshold", "argmax"}
        ``argmax``: the most probable class state (ties to the lowest state index);
        ``terminals`` are then all class states in the network's order.
    """

    features: tuple[str, ...]
    states: tuple[tuple[str, ...], ...]
    terminals: tuple[str, ...]
    node_level: np.ndarray
    node_children: np.ndarray
    root: int
    class_variable: str
    positive: str | None
    threshold: float | None
    decision: str = THRESHOLD

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", tuple(str(f) for f in self.features))
        object.__setattr__(self, "states", tuple(tuple(str(s) for s in st) for st in self.states))
        object.__setattr__(self, "terminals", tuple(str(t) for t in self.terminals))
        object.__setattr__(self, "root", int(self.root))
        if self.decision not in DECISIONS:
            raise ValueError(f"decision {self.decision!r} is not one of {DECISIONS}")
        if self.decision == ARGMAX:
            if self.positive is not None or self.threshold is not None:
                raise ValueError("an argmax diagram has no positive state and no threshold")
        else:
            if self.positive is None or self.threshold is None:
                raise ValueError("a threshold diagram needs a positive state and a threshold")
            object.__setattr__(self, "threshold", float(self.threshold))
        level = np.array(self.node_level, dtype=np.int32).reshape(-1)
        children = np.array(self.node_children, dtype=np.int32)
        if children.size == 0 and level.size == 0:
            width = max((len(s) for s in self.states), default=0)
            children = np.zeros((0, width), dtype=np.int32)
        if children.ndim != 2 or children.shape[0] != level.shape[0]:
            raise ValueError(
                f"node_children has shape {children.shape}; expected ({level.shape[0]}, max_card)"
            )
        level.flags.writeable = False
        children.flags.writeable = False
        object.__setattr__(self, "node_level", level)
        object.__setattr__(self, "node_children", children)

    # ------------------------------------------------------------------ equality
    def same_as(self, other: DecisionDiagram) -> bool:
        """True when both diagrams are identical: same order, names, decision and arrays."""
        return (
            self.same_function(other)
            and self.class_variable == other.class_variable
            and self.positive == other.positive
            and self.threshold == other.threshold
            and self.decision == other.decision
        )

    def same_function(self, other: DecisionDiagram) -> bool:
        """True when both compute the same labels under the same order (decision meta aside)."""
        return (
            isinstance(other, DecisionDiagram)
            and self.features == other.features
            and self.states == other.states
            and self.terminals == other.terminals
            and self.root == other.root
            and np.array_equal(self.node_level, other.node_level)
            and np.array_equal(self.node_children, other.node_children)
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DecisionDiagram):
            return NotImplemented
        return self.same_as(other)

    __hash__ = None  # type: ignore[assignment]  # mutable value equality: unhashable

    # ------------------------------------------------------------------ sizes
    @property
    def n_features(self) -> int:
        """Number of levels (features)."""
        return len(self.features)

    @property
    def n_terminals(self) -> int:
        """Number of sinks (class states)."""
        return len(self.terminals)

    @property
    def n_nodes(self) -> int:
        """Number of internal (non-sink) nodes of the reduced diagram."""
        return int(self.node_level.shape[0])

    @cached_property
    def cardinalities(self) -> np.ndarray:
        """ndarray of shape (n_features,): number of states per level."""
        return np.array([len(s) for s in self.states], dtype=np.int64)

    @property
    def nodes_per_level(self) -> tuple[int, ...]:
        """Internal nodes per level of the reduced diagram, in variable order."""
        return tuple(int(c) for c in np.bincount(self.node_level, minlength=self.n_features))

    @property
    def n_edges(self) -> int:
        """Number of (node, value) edges of the reduced diagram."""
        return int(self.cardinalities[self.node_level].sum()) if self.n_nodes else 0

    @property
    def is_argmax(self) -> bool:
        """True for a multi-class (argmax) diagram: sinks are all class states."""
        return self.decision == ARGMAX

    @property
    def positive_terminal(self) -> int:
        """Sink id of the positive class state (threshold diagrams only)."""
        if self.positive is None:
            raise ValueError("an argmax diagram has no positive state")
        return self.terminals.index(self.positive)

    @cached_property
    def _levels_all(self) -> np.ndarray:
        """Level of every node id, sinks at level ``n_features``."""
        return np.concatenate(
            [np.full(self.n_terminals, self.n_features, dtype=np.int32), self.node_level]
        )

    def quasi_nodes_per_level(self) -> tuple[int, ...]:
        """Internal nodes per level of the quasi-reduced diagram (every path tests every level).

        A node ``u`` first reached from a parent at level ``m`` (the root: from level -1)
        stands for one quasi-reduced node at each level ``m+1 .. level(u)`` (sinks: up to
        the last level), which is what a bottom-up unique-rows construction keeps.
        """
        n, nt = self.n_features, self.n_terminals
        lv = self._levels_all
        min_parent = np.full(nt + self.n_nodes, n, dtype=np.int64)
        min_parent[self.root] = -1
        if self.n_nodes:
            src = np.repeat(self.node_level.astype(np.int64), self.node_children.shape[1])
            dst = self.node_children.reshape(-1).astype(np.int64)
            ok = dst >= 0
            np.minimum.at(min_parent, dst[ok], src[ok])
        diff = np.zeros(n + 1, dtype=np.int64)
        reach = np.nonzero(min_parent < n)[0]
        lo = min_parent[reach] + 1
        hi = np.minimum(lv[reach], n - 1) + 1  # exclusive
        keep = hi > lo
        np.add.at(diff, lo[keep], 1)
        np.add.at(diff, hi[keep], -1)
        return tuple(int(c) for c in np.cumsum(diff)[:n])

    @property
    def n_nodes_quasi(self) -> int:
        """Internal node count of the quasi-reduced diagram (the papers' figure)."""
        return int(sum(self.quasi_nodes_per_level()))

    # ------------------------------------------------------------------ evaluation
    @cached_property
    def _eval_tables(self) -> tuple[np.ndarray, np.ndarray]:
        """(level of every id, children of every id with sinks as self-loops)."""
        nt, width = self.n_terminals, max(1, self.node_children.shape[1])
        table = np.empty((nt + self.n_nodes, width), dtype=np.int32)
        table[:nt] = np.arange(nt, dtype=np.int32)[:, None]
        if self.n_nodes:
            table[nt:, : self.node_children.shape[1]] = self.node_children
        return self._levels_all, table

    def check_indices(self, X: Any) -> np.ndarray:
        """Validate a batch of state indices and return it as an int array.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), or sequence of mappings
            State indices in ``features`` order; or state names in that order (a string
            array); or records ``{feature: state name}`` (see :meth:`encode`).

        Returns
        -------
        ndarray of shape (n_samples, n_features), int64
        """
        if isinstance(X, Sequence) and X and isinstance(X[0], Mapping):
            return self.encode(X)
        X = np.asarray(X)
        if X.ndim == 2 and X.dtype.kind in "UO" and X.shape[1] == self.n_features:
            return self.encode_names(X)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(
                f"X has shape {X.shape}; expected (n_samples, {self.n_features}) "
                f"in the order {list(self.features)}"
            )
        if X.dtype.kind not in "iu":
            raise ValueError(f"X has dtype {X.dtype}; expected integer state indices")
        bad = (X < 0) | (X >= self.cardinalities)
        if bad.any():
            row, col = map(int, np.argwhere(bad)[0])
            raise ValueError(
                f"X[{row}, {col}] = {int(X[row, col])} is not a state index of "
                f"{self.features[col]!r} (0..{len(self.states[col]) - 1}); "
                f"{int(bad.sum())} bad entries in all"
            )
        return X

    def predict(self, X: Any) -> np.ndarray:
        """Sink id (index into ``terminals``) reached by each assignment.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), or sequence of mappings
            State indices in ``features`` order, state names, or records
            (see :meth:`check_indices`).

        Returns
        -------
        ndarray of shape (n_samples,), int32
        """
        X = self.check_indices(X)
        levels, table = self._eval_tables
        cur = np.full(X.shape[0], self.root, dtype=np.int32)
        if self.root < self.n_terminals:
            return cur
        width = table.shape[1]
        flat = table.reshape(-1)
        start = int(self.node_level[self.root - self.n_terminals])
        for lvl in range(start, self.n_features):
            here = levels[cur] == lvl
            step = flat[cur.astype(np.int64) * width + X[:, lvl]]
            cur = np.where(here, step, cur)
        return cur

    def predict_labels(self, X: Any) -> np.ndarray:
        """Terminal label (class state name) per assignment: ndarray of shape (n_samples,)."""
        return np.asarray(self.terminals, dtype=object)[self.predict(X)]

    def predict_positive(self, X: Any) -> np.ndarray:
        """Boolean decision ``P(C = positive | x) >= threshold`` per assignment.

        Raises ``ValueError`` on an argmax diagram (use :meth:`predict_labels`).
        """
        return self.predict(X) == self.positive_terminal

    @cached_property
    def _state_index(self) -> tuple[dict[str, int], ...]:
        return tuple({s: j for j, s in enumerate(st)} for st in self.states)

    def encode(self, records: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """Map records of ``{feature: state name}`` to state indices in ``features`` order.

        Each record is mapped by :func:`state_indices`: every feature exactly once and no
        other key (the class or another variable in a record is an error).

        Parameters
        ----------
        records : sequence of mappings, length n_samples

        Returns
        -------
        ndarray of shape (n_samples, n_features), int64

        Raises
        ------
        RecordError
            Naming the record (position in ``records``) and the variable (and state), when
            a record is not a mapping, names a variable that is not a feature, lacks a
            feature or gives a state that is not one of the feature's states.
        """
        out = np.empty((len(records), self.n_features), dtype=np.int64)
        for i, rec in enumerate(records):
            if not isinstance(rec, Mapping):
                raise RecordError(
                    f"record {i}: expected a mapping of feature to state name, "
                    f"got {type(rec).__name__}",
                    record=i,
                    variable=self.features[0] if self.features else "",
                    reason="bad_schema",
                )
            try:
                out[i] = state_indices(rec, self.features, self._state_index, record=i)
            except RecordError as exc:
                raise RecordError(
                    f"record {i}: {exc}",
                    record=i,
                    variable=exc.variable,
                    state=exc.state,
                    reason=exc.reason,
                ) from None
        return out

    def encode_names(self, names: Any) -> np.ndarray:
        """Map a string array of state names (columns in ``features`` order) to indices.

        Parameters
        ----------
        names : array-like of str, shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_features), int64

        Raises
        ------
        RecordError
            Naming the first row and feature whose state is unknown.
        """
        names = np.asarray(names)
        if names.ndim != 2 or names.shape[1] != self.n_features:
            raise ValueError(
                f"names has shape {names.shape}; expected (n_samples, {self.n_features})"
            )
        out = np.empty(names.shape, dtype=np.int64)
        for col, index in enumerate(self._state_index):
            uniq, inverse = np.unique(names[:, col].astype(str), return_inverse=True)
            codes = np.array([index.get(str(u), -1) for u in uniq], dtype=np.int64)
            if (codes < 0).any():
                bad = str(uniq[np.argmax(codes < 0)])
                row = int(np.nonzero(names[:, col].astype(str) == bad)[0][0])
                raise RecordError(
                    f"record {row}: feature {self.features[col]!r} has state {bad!r}, "
                    f"not one of {list(self.states[col])}",
                    record=row,
                    variable=self.features[col],
                    state=bad,
                )
            out[:, col] = codes[inverse.reshape(-1)]
        return out

    # ------------------------------------------------------------------ counting
    def completions(
        self,
        sinks: np.ndarray,
        allowed: Sequence[np.ndarray] | None = None,
        *,
        dtype: Any = object,
    ) -> np.ndarray:
        """Model counting: per node id (sinks first), how many assignments of the levels
        from the node's level down reach a sink marked in ``sinks``.

        The one counting routine (:meth:`counts` here, the verifier's violation counts).
        ``allowed[lvl]`` restricts level ``lvl`` to those state indices (default: all); a
        skipped level multiplies by its number of allowed states. Linear in the diagram's
        size. ``dtype=object`` counts in Python integers (exact past 2**63); ``np.int64``
        is faster when the caller knows the counts fit.
        """
        n, nt = self.n_features, self.n_terminals
        if allowed is None:
            allowed = [np.arange(int(c)) for c in self.cardinalities]
        sizes = [int(a.size) for a in allowed]
        suffix = [1] * (n + 1)
        for lvl in range(n - 1, -1, -1):
            suffix[lvl] = suffix[lvl + 1] * sizes[lvl]
        lv = self._levels_all
        count = np.zeros(nt + self.n_nodes, dtype=dtype)
        marks = np.asarray(sinks, dtype=bool)
        count[:nt] = [int(m) for m in marks] if dtype is object else marks  # Python ints
        for lvl in range(n - 1, -1, -1):
            ks = np.nonzero(self.node_level == lvl)[0]
            if not ks.size:
                continue
            ch = self.node_children[ks][:, allowed[lvl]]
            skip = np.array([suffix[lvl + 1] // s for s in suffix], dtype=dtype)[lv[ch]]
            count[nt + ks] = (count[ch] * skip).sum(axis=1)
        return count

    def counts(self) -> dict[str, int]:
        """Exact number of full assignments reaching each sink, by terminal label.

        One pass from the root down, every sink at once (linear in the diagram's size, not
        in its size times its sinks: an argmax diagram has a sink per class state): each
        node passes the assignments reaching it to its children, times the states of the
        levels an edge skips. Python integers, so feature spaces past 2**63 count exactly.
        """
        n, nt = self.n_features, self.n_terminals
        cards = [int(c) for c in self.cardinalities]
        suffix = [1] * (n + 1)
        for lvl in range(n - 1, -1, -1):
            suffix[lvl] = suffix[lvl + 1] * cards[lvl]
        lv = self._levels_all
        reach = np.zeros(nt + self.n_nodes, dtype=object)
        reach[:] = 0
        reach[self.root] = suffix[0] // suffix[int(lv[self.root])]
        for lvl in range(n):
            ks = np.nonzero(self.node_level == lvl)[0]
            if not ks.size:
                continue
            ch = self.node_children[ks][:, : cards[lvl]]
            skip = np.array([suffix[lvl + 1] // s for s in suffix], dtype=object)[lv[ch]]
            np.add.at(reach, ch.reshape(-1), (reach[nt + ks][:, None] * skip).reshape(-1))
        return {term: int(reach[t]) for t, term in enumerate(self.terminals)}

    def count(self, terminal: str | int) -> int:
        """Exact number of full assignments reaching one sink (by label or sink id)."""
        label = self.terminals[terminal] if isinstance(terminal, int) else terminal
        if label not in self.terminals:
            raise ValueError(f"{label!r} is not a terminal of this diagram: {list(self.terminals)}")
        return self.counts()[label]

    @property
    def n_inputs(self) -> int:
        """Number of full assignments: the product of the cardinalities."""
        total = 1
        for c in self.cardinalities:
            total *= int(c)
        return total

    # ------------------------------------------------------------------ construction
    @classmethod
    def canonical(
        cls,
        *,
        features: Sequence[str],
        states: Sequence[Sequence[str]],
        terminals: Sequence[str],
        node_level: Any,
        node_children: Any,
        root: int,
        class_variable: str,
        positive: str | None,
        threshold: float | None,
        decision: str = THRESHOLD,
    ) -> DecisionDiagram:
        """Reduce and renumber any node table into the canonical diagram of its function.

        The input may hold redundant, duplicate and unreachable nodes and any numbering,
        provided edges go to strictly deeper levels (sinks count as level ``n_features``)
        and ids follow the sink/internal convention above.
        """
        cards = np.array([len(s) for s in states], dtype=np.int64)
        level, children, root = _reduce(
            np.asarray(node_level, dtype=np.int64).reshape(-1),
            np.asarray(node_children, dtype=np.int64),
            int(root),
            len(terminals),
            cards,
        )
        return cls(
            features=tuple(features),
            states=tuple(tuple(s) for s in states),
            terminals=tuple(terminals),
            node_level=level,
            node_children=children,
            root=root,
            class_variable=class_variable,
            positive=positive,
            threshold=threshold,
            decision=decision,
        )

    def is_canonical(self) -> bool:
        """True when the diagram is already in canonical (reduced, renumbered) form."""
        again = DecisionDiagram.canonical(
            features=self.features,
            states=self.states,
            terminals=self.terminals,
            node_level=self.node_level,
            node_children=self.node_children,
            root=self.root,
            class_variable=self.class_variable,
            positive=self.positive,
            threshold=self.threshold,
            decision=self.decision,
        )
        return again.same_as(self)

    # ------------------------------------------------------------------ serialisation
    def meta(self) -> dict[str, Any]:
        """The JSON half of the serialised diagram."""
        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "class_variable": self.class_variable,
            "positive": self.positive,
            "threshold": self.threshold,
            "decision": DECISION_TEXT[self.decision],
            "decision_kind": self.decision,
            "features": list(self.features),
            "states": [list(s) for s in self.states],
            "terminals": list(self.terminals),
            "root": self.root,
            "n_nodes": self.n_nodes,
        }

    def to_members(self, prefix: str = DIAGRAM_PREFIX) -> dict[str, Any]:
        """Artifact members: ``{prefix}diagram.json`` (meta) and ``{prefix}diagram.npz`` (arrays)."""
        return {
            f"{prefix}{DIAGRAM_JSON}": self.meta(),
            f"{prefix}{DIAGRAM_NPZ}": {
                "node_level": np.asarray(self.node_level, dtype=np.int32),
                "node_children": np.asarray(self.node_children, dtype=np.int32),
            },
        }

    @classmethod
    def from_members(
        cls, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], *, where: str = "bn"
    ) -> DecisionDiagram:
        """Rebuild a diagram from :meth:`to_members`' JSON and arrays, validating everything.

        Raises
        ------
        ArtifactError
            On a wrong schema, missing or mistyped fields, arrays of the wrong shape, node ids
            out of range, edges that do not go to deeper levels, or a non-canonical diagram.
        """

        def bad(problem: str) -> ArtifactError:
            return ArtifactError(f"{where} diagram: {problem}")

        if not isinstance(meta, Mapping):
            raise bad("meta is not a JSON object")
        if meta.get("schema") != SCHEMA:
            raise bad(f"schema is {meta.get('schema')!r}, expected {SCHEMA!r}")
        if meta.get("schema_version") != SCHEMA_VERSION:
            raise bad(f"schema_version {meta.get('schema_version')!r} is not supported")
        features = meta.get("features")
        states = meta.get("states")
        terminals = meta.get("terminals")
        if not _str_list(features) or len(set(features)) != len(features):
            raise bad("'features' must be a list of distinct strings")
        if (
            not isinstance(states, list)
            or len(states) != len(features)
            or not all(_str_list(s) and len(s) >= 1 and len(set(s)) == len(s) for s in states)
        ):
            raise bad("'states' must hold one non-empty list of distinct names per feature")
        if not _str_list(terminals) or len(terminals) < 1 or len(set(terminals)) != len(terminals):
            raise bad("'terminals' must be a non-empty list of distinct strings")
        kind = meta.get("decision_kind", THRESHOLD)
        if kind not in DECISIONS:
            raise bad(f"'decision_kind' {kind!r} is not one of {list(DECISIONS)}")
        if not isinstance(meta.get("class_variable"), str):
            raise bad("'class_variable' must be a string")
        threshold = meta.get("threshold")
        if kind == ARGMAX:
            if meta.get("positive") is not None or threshold is not None:
                raise bad("an argmax diagram has 'positive' and 'threshold' null")
        else:
            if not isinstance(meta.get("positive"), str):
                raise bad("'positive' must be a string")
            if meta["positive"] not in terminals:
                raise bad(f"positive {meta['positive']!r} is not a terminal {terminals}")
            if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
                raise bad("'threshold' must be a number")
            threshold = float(threshold)
        root = meta.get("root")
        if isinstance(root, bool) or not isinstance(root, int):
            raise bad("'root' must be an integer")
        for key in ("node_level", "node_children"):
            if key not in arrays:
                raise bad(f"array {key!r} is missing")
            if np.asarray(arrays[key]).dtype.kind not in "iu":
                raise bad(f"array {key!r} is not an integer array")
        level = np.asarray(arrays["node_level"]).astype(np.int64)
        children = np.asarray(arrays["node_children"]).astype(np.int64)
        n, nt, k = len(features), len(terminals), level.shape[0] if level.ndim == 1 else -1
        cards = np.array([len(s) for s in states], dtype=np.int64)
        width = int(cards.max()) if n else 0
        if level.ndim != 1:
            raise bad(f"node_level has shape {level.shape}, expected one dimension")
        if children.shape != (k, width):
            raise bad(f"node_children has shape {children.shape}, expected {(k, width)}")
        if meta.get("n_nodes", k) != k:
            raise bad(f"n_nodes {meta.get('n_nodes')} disagrees with {k} nodes in the arrays")
        if not 0 <= root < nt + k:
            raise bad(f"root {root} is not a node id (0..{nt + k - 1})")
        if k:
            if level.min() < 0 or level.max() >= n:
                raise bad(f"node levels must lie in 0..{n - 1}")
            valid = np.arange(width)[None, :] < cards[level][:, None]
            if (children[~valid] != -1).any():
                raise bad("children beyond a level's cardinality must be -1")
            used = children[valid]
            if used.min() < 0 or used.max() >= nt + k:
                raise bad(f"child ids must lie in 0..{nt + k - 1}")
            lv = np.concatenate([np.full(nt, n), level])
            if (lv[children] <= level[:, None])[valid].any():
                raise bad("an edge does not go to a deeper level")
        diagram = cls(
            features=tuple(features),
            states=tuple(tuple(s) for s in states),
            terminals=tuple(terminals),
            node_level=level,
            node_children=children,
            root=root,
            class_variable=meta["class_variable"],
            positive=meta.get("positive"),
            threshold=threshold,
            decision=kind,
        )
        if not diagram.is_canonical():
            raise bad("nodes are not in canonical (reduced, breadth-first numbered) form")
        return diagram


def _str_list(value: Any) -> TypeGuard[list[str]]:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


_DENSE_KEYS = 1 << 16
"""Key spaces up to this size are counted (:func:`unique_rows`), larger ones sorted."""


def unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of a small non-negative (or -1) int matrix and each row's index in them.

    Rows are packed into one int64 key when they fit (much faster to sort than rows); when
    the rows are at least a quarter as many as the possible keys and those keys fit
    :data:`_DENSE_KEYS`, or are at most a quarter as many as the rows (a large table of few
    small values, such as the decision bits of a separator's sub-classifiers, or node
    indices of a level below), they are counted instead of sorted, column by column
    without an int64 copy of the rows (a quarter of the memory on binary rows; on small
    tables the counting arrays would cost more than the sort).

    Returns
    -------
    uniq : ndarray of shape (n_unique, width)
    inverse : ndarray of shape (n_rows,)
    """
    n, width = rows.shape
    if n == 0:
        return np.zeros((0, width), dtype=np.int64), np.zeros(0, dtype=np.int64)
    if rows.dtype.kind in "iu":
        base = int(rows.max()) + 2
        space = base**width
        if space <= 4 * n and (space <= _DENSE_KEYS or space <= n // 4) and int(rows.min()) >= -1:
            key = np.zeros(n, dtype=np.int32)
            for j in range(width):
                key *= base
                key += rows[:, j]
                key += 1
            present = np.bincount(key, minlength=space) > 0
            first = np.full(space, -1, dtype=np.int64)
            first[key[::-1]] = np.arange(n - 1, -1, -1)
            idmap = np.cumsum(present) - 1
            uniq = np.ascontiguousarray(rows[first[present]], dtype=np.int64)
            return uniq, idmap[key]
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    base = int(rows.max()) + 2
    if width * np.log2(base) < 62:
        key = np.zeros(n, dtype=np.int64)
        for j in range(width):
            key = key * base + (rows[:, j] + 1)
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        return rows[first], inverse.reshape(-1)
    uniq, inverse = np.unique(rows, axis=0, return_inverse=True)
    return uniq, inverse.reshape(-1)


def _reduce(
    level: np.ndarray, children: np.ndarray, root: int, nt: int, cards: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int]:
    """Canonical node table of a diagram; assumes edges go to deeper levels (unchecked)."""
    n = cards.shape[0]
    width = int(cards.max()) if n else 0
    k = level.shape[0]
    remap = np.arange(nt + k, dtype=np.int64)
    new_level: list[np.ndarray] = []
    new_children: list[np.ndarray] = []
    next_id = nt
    for lvl in range(n - 1, -1, -1):
        ks = np.nonzero(level == lvl)[0]
        if not ks.size:
            continue
        card = int(cards[lvl])
        ch = remap[children[ks, :card]]
        redundant = (ch == ch[:, :1]).all(axis=1)
        remap[nt + ks[redundant]] = ch[redundant, 0]
        rest = ks[~redundant]
        if rest.size:
            rows, inverse = unique_rows(ch[~redundant])
            remap[nt + rest] = next_id + inverse
            padded = np.full((rows.shape[0], width), -1, dtype=np.int64)
            padded[:, :card] = rows
            new_level.append(np.full(rows.shape[0], lvl, dtype=np.int64))
            new_children.append(padded)
            next_id += rows.shape[0]
    root = int(remap[root])
    if not new_level or root < nt:
        return np.zeros(0, np.int32), np.zeros((0, width), np.int32), root
    level2 = np.concatenate(new_level)
    children2 = np.concatenate(new_children)
    order = _bfs_order(children2, root - nt, nt)
    order = order[np.argsort(level2[order], kind="stable")]
    renum = np.arange(nt + level2.shape[0], dtype=np.int64)
    renum[nt + order] = nt + np.arange(order.shape[0])
    out_children = children2[order]
    out_children = np.where(out_children >= 0, renum[np.maximum(out_children, 0)], -1)
    return (
        level2[order].astype(np.int32),
        out_children.astype(np.int32),
        int(renum[root]),
    )


def _bfs_order(children: np.ndarray, root_k: int, nt: int) -> np.ndarray:
    """Internal indices reachable from ``root_k`` in breadth-first discovery order."""
    seen = np.zeros(children.shape[0], dtype=bool)
    seen[root_k] = True
    frontier = np.array([root_k], dtype=np.int64)
    found = [frontier]
    while frontier.size:
        ch = children[frontier].reshape(-1)
        ch = ch[ch >= nt] - nt
        if not ch.size:
            break
        uniq, first = np.unique(ch, return_index=True)
        nxt = uniq[np.argsort(first, kind="stable")]
        nxt = nxt[~seen[nxt]]
        seen[nxt] = True
        frontier = nxt
        found.append(nxt)
    return np.concatenate(found)
