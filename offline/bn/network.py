"""A discrete Bayesian network as the compiler reads it: the one form every reader makes.

Numbers as written: beside each float table a reader keeps the CPT's numbers as the decimal
strings of the file (:attr:`Network.texts`, one object array per CPT, references to the
tokens the tokenizer made anyway); :meth:`Network.exact_cpt` turns them into the exact
rationals they denote, lazily, when the compiler has to decide an input exactly
(:mod:`boxwatch.offline.bn.exact`).

The reading (docs/exactness.md): a CPT row is a conditional distribution, so the network the
compiler and the verifier decide on is the file's with **each row divided by its sum**
(:meth:`Network.renormalised`; :data:`READING`). Rows that sum to exactly 1 are unchanged;
the readers refuse rows further than
:data:`~boxwatch.offline.bn.formats.common.CPT_SUM_TOLERANCE` from 1, and rows further than
:data:`ROW_WARN_TOLERANCE` draw a warning (:meth:`RowSums.warning`). A reader of another
format keeps its value tokens the same way: the strings in file order, :func:`text_table` to
shape them, ``texts=`` to :class:`Network`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np


def text_table(texts: Sequence[str], shape: Sequence[int]) -> np.ndarray:
    """A CPT's numbers as written (decimal strings, file order) as an object array of
    ``shape``: what a reader passes as ``texts=`` to :class:`Network`."""
    out = np.empty(len(texts), dtype=object)
    out[:] = list(texts)
    return out.reshape(tuple(shape))


def _row_totals(ints: np.ndarray) -> list[int]:
    """Sum of each row (last axis) of an object array of Python ints."""
    return [sum(row) for row in ints.reshape(-1, ints.shape[-1]).tolist()]


def _object_array(values: list[Any], shape: tuple[int, ...]) -> np.ndarray:
    """``values`` (Python numbers) as an object array of ``shape``."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.reshape(shape)


def exact_value(text: str) -> Fraction:
    """The rational a number's decimal string denotes (``"0.98"`` is 49/50, not the float)."""
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return Fraction(float(text))


READING = "each CPT row divided by its sum"
"""How every route and the exact decisions read a network's numbers (:meth:`Network.renormalised`)."""
ROW_WARN_TOLERANCE = 1e-6
"""Rows whose sum is further than this from 1 draw a warning: more than the rounding of a
file written with six or more decimals (tcc4e's rows are off by up to 1.6e-7)."""


@dataclass(frozen=True)
class RowSums:
    """How far a network's CPT rows, as written, are from summing to 1 (exactly).

    Attributes
    ----------
    largest : float
        The largest ``|row sum - 1|`` over every row of every CPT (computed in rationals).
    variable : str or None
        The CPT holding it (None when every row sums to exactly 1).
    rows : int
        Rows whose sum is not exactly 1 (each is divided by its sum: :data:`READING`).
    """

    largest: float
    variable: str | None
    rows: int

    def text(self) -> str:
        """The reading and the largest deviation, for the commands' output: ``each CPT row
        divided by its sum (1,208 rows off 1 as written, the largest by 1.6e-07, in
        'var_82')``."""
        if not self.rows:
            return f"{READING} (every row sums to exactly 1 as written)"
        return (
            f"{READING} ({self.rows:,} row{'s' if self.rows != 1 else ''} off 1 as written, "
            f"the largest by {self.largest:.2g}, in {self.variable!r})"
        )

    def warning(self) -> str | None:
        """A one-line warning when a row is off 1 by more than :data:`ROW_WARN_TOLERANCE`."""
        if self.largest <= ROW_WARN_TOLERANCE:
            return None
        return (
            f"the CPT of {self.variable!r} has a row whose sum is off 1 by {self.largest:.3g} "
            f"(more than {ROW_WARN_TOLERANCE:g}); every row is read divided by its sum"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (``reading`` in the commands' ``--json``)."""
        return {
            "reading": READING,
            "rows_off": self.rows,
            "largest_row_deviation": self.largest,
            "variable": self.variable,
        }


_PLAIN_DECIMALS = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?: (?:[0-9]+\.?[0-9]*|\.[0-9]+))*")
"""Space-separated plain decimals (no sign, no exponent)."""


@dataclass(frozen=True)
class Network:
    """A discrete Bayesian network: the only form the compiler reads.

    Attributes
    ----------
    name : str
    variables : tuple of str
        Variables in file order.
    states : dict of str to tuple of str
        State names per variable, in file order (state index j is ``states[v][j]``).
    parents : dict of str to tuple of str
    cpts : dict of str to ndarray of shape (*parent_cards, card)
        ``cpts[v][p1, ..., pk, j] = P(v = j | parents = (p1, ..., pk))``.
    source : str
        Where the network came from (a path, or ``"<pgmpy>"``).
    texts : dict of str to object ndarray, optional
        The CPT numbers as written in the file (decimal strings, same shapes as ``cpts``).
        Absent (a network built in memory, or from pgmpy) or missing for a variable: each
        float's shortest round-trip decimal (``repr``), the text :func:`write_bif` writes,
        so a network and its BIF dump define the same exact classifier.
    """

    name: str
    variables: tuple[str, ...]
    states: Mapping[str, tuple[str, ...]]
    parents: Mapping[str, tuple[str, ...]]
    cpts: Mapping[str, np.ndarray]
    source: str = "<memory>"
    texts: Mapping[str, np.ndarray] | None = field(default=None, repr=False, compare=False)
    _exact: dict[str, np.ndarray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _scaled: dict[str, tuple[np.ndarray, int]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def exact_cpt(self, var: str) -> np.ndarray:
        """``P(var | parents)`` as written: an object array of :class:`~fractions.Fraction`.

        Built on first use and kept. These are the file's numbers; the network the
        compiler decides on is :meth:`renormalised`.
        """
        table = self._exact.get(var)
        if table is None:
            text = self.texts.get(var) if self.texts is not None else None
            if text is None:
                floats = self.cpts[var].reshape(-1).tolist()
                text = text_table([repr(x) for x in floats], self.cpts[var].shape)
            flat = [exact_value(t) for t in text.reshape(-1).tolist()]
            table = np.empty(len(flat), dtype=object)
            table[:] = flat
            table = table.reshape(self.cpts[var].shape)
            self._exact[var] = table
        return table

    def scaled_cpt(self, var: str) -> tuple[np.ndarray, int]:
        """:meth:`exact_cpt` times a common denominator ``D`` of its numbers: an object
        array of Python ints, and ``D`` (exact arithmetic on integers, no gcd per step).

        Plain decimal strings (``0.908257``) are read as digits over ``D = 10**k``, ``k``
        their most decimal places, without a :class:`~fractions.Fraction` each; any other
        text goes through :meth:`exact_cpt` (``D`` the least common denominator). Built on
        first use and kept.
        """
        got = self._scaled.get(var)
        if got is None:
            shape = self.cpts[var].shape
            text = self.texts.get(var) if self.texts is not None else None
            words = text.reshape(-1).tolist() if text is not None else []
            if words and _PLAIN_DECIMALS.fullmatch(" ".join(words)):
                # plain decimals (the readers parsed each as a number): digits over 10**k
                parts = [w.partition(".") for w in words]
                k = max(len(f) for _, _, f in parts)
                values = [int(a + f + "0" * (k - len(f))) for a, _, f in parts]
                scale = 10**k
            else:
                flat = self.exact_cpt(var).reshape(-1).tolist()
                scale = math.lcm(*(q.denominator for q in flat)) if flat else 1
                values = [q.numerator * (scale // q.denominator) for q in flat]
            ints = np.empty(len(values), dtype=object)
            ints[:] = values
            got = (ints.reshape(shape), scale)
            self._scaled[var] = got
        return got

    @functools.cached_property
    def row_sums(self) -> RowSums:
        """How far the rows, as written, are from summing to 1 (exactly, from
        :meth:`scaled_cpt`)."""
        largest, where, rows = Fraction(0), None, 0
        for v in self.variables:
            ints, scale = self.scaled_cpt(v)
            for total in _row_totals(ints):
                if total != scale:
                    rows += 1
                    off = Fraction(abs(total - scale), scale)
                    if off > largest:
                        largest, where = off, v
        return RowSums(float(largest), where, rows)

    @functools.cached_property
    def renormalised(self) -> Network:
        """This network with each CPT row divided by its sum: the one the compiler decides
        on (:data:`READING`); the network itself when every row sums to exactly 1.

        A changed CPT's floats are the nearest doubles to its exact rationals (one rounding
        each, as a number read from a file), and its exact and scaled tables are kept with
        it; the other CPTs are shared with this network.
        """
        if not self.row_sums.rows:
            return self
        cpts = dict(self.cpts)
        texts = dict(self.texts) if self.texts is not None else {}
        exact: dict[str, np.ndarray] = {}
        scaled: dict[str, tuple[np.ndarray, int]] = {}
        for v in self.variables:
            ints, scale = self.scaled_cpt(v)
            totals = _row_totals(ints)
            if all(t == scale for t in totals):
                continue
            shape = ints.shape
            common = math.lcm(*{t for t in totals if t})
            # a row of zeros (an impossible parent configuration, built in memory) stays zero
            rows = [
                (row, t or 1)
                for row, t in zip(ints.reshape(len(totals), -1).tolist(), totals, strict=True)
            ]
            flat_int = [n * (common // t) for row, t in rows for n in row]
            flat_q = [Fraction(n, t) for row, t in rows for n in row]
            cpts[v] = np.array([n / t for row, t in rows for n in row]).reshape(shape)
            exact[v] = _object_array(flat_q, shape)
            scaled[v] = (_object_array(flat_int, shape), common)
            texts.pop(v, None)
        out = Network(
            name=self.name,
            variables=self.variables,
            states=self.states,
            parents=self.parents,
            cpts=cpts,
            source=self.source,
            texts=texts or None,
        )
        out._exact.update(exact)
        out._scaled.update(scaled)
        return out

    def card(self, var: str) -> int:
        """Number of states of ``var``."""
        return len(self.states[var])

    def children(self, var: str) -> tuple[str, ...]:
        """Variables that have ``var`` as a parent, in file order."""
        return self._children.get(var, ())

    @functools.cached_property
    def _children(self) -> dict[str, tuple[str, ...]]:
        """Every variable's children, in file order: made once (asking each variable in turn
        is then linear in the network, not quadratic)."""
        out: dict[str, list[str]] = {}
        for v in self.variables:
            for p in dict.fromkeys(self.parents[v]):
                out.setdefault(p, []).append(v)
        return {p: tuple(vs) for p, vs in out.items()}

    def leaves(self) -> tuple[str, ...]:
        """Variables without children, in file order."""
        has_child = {p for v in self.variables for p in self.parents[v]}
        return tuple(v for v in self.variables if v not in has_child)

    def ancestors(self, nodes: Sequence[str]) -> set[str]:
        """``nodes`` and all their ancestors."""
        out: set[str] = set()
        stack = list(nodes)
        while stack:
            v = stack.pop()
            if v not in out:
                out.add(v)
                stack.extend(self.parents[v])
        return out

    def to_pgmpy(self) -> Any:
        """The same network as a pgmpy ``DiscreteBayesianNetwork`` (for exact inference)."""
        from pgmpy.factors.discrete import TabularCPD
        from pgmpy.models import DiscreteBayesianNetwork

        model = DiscreteBayesianNetwork()
        model.add_nodes_from(self.variables)
        model.add_edges_from([(p, v) for v in self.variables for p in self.parents[v]])
        for v in self.variables:
            par = list(self.parents[v])
            table = np.moveaxis(self.cpts[v], -1, 0).reshape(self.card(v), -1)
            model.add_cpds(
                TabularCPD(
                    v,
                    self.card(v),
                    table,
                    evidence=par or None,
                    evidence_card=[self.card(p) for p in par] or None,
                    state_names={u: list(self.states[u]) for u in [v, *par]},
                )
            )
        return model
