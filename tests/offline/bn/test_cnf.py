"""CNF encoding of reduced decision diagrams: models map one-to-one onto feature assignments."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from bn_tables import all_assignments, compile_reference, diagram_from_table, random_table
from pysat.solvers import Solver

from boxwatch.offline.bn.cnf import (
    PAIRWISE_LIMIT,
    encode_copies,
    encode_diagram,
    strictly_increasing,
)


def enumerate_models(clauses, assumptions=()):
    with Solver(name="minisat22", bootstrap_with=clauses) as s:
        return list(s.enum_models(assumptions=list(assumptions)))


def check_bijection(diagram, table=None):
    """Every model decodes to a distinct assignment; all assignments appear; sinks agree."""
    enc = encode_diagram(diagram)
    cards = tuple(int(c) for c in diagram.cardinalities)
    models = enumerate_models(enc.clauses)
    xs = np.array([enc.decode(m) for m in models])
    assert len(models) == diagram.n_inputs
    assert len({tuple(x) for x in xs}) == len(models)
    expected = diagram.predict(xs) if table is None else table[tuple(xs.T)]
    for m, want in zip(models, expected, strict=True):
        true_sinks = [t for t in range(diagram.n_terminals) if enc.sink_literal(t) in m]
        assert true_sinks == [int(want)]
    assert set(map(tuple, xs)) == set(map(tuple, all_assignments(cards)))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kind", ["additive", "random"])
def test_models_are_assignments_one_to_one(seed, kind):
    rng = np.random.default_rng(seed)
    cards = tuple(int(c) for c in rng.integers(1, 4, size=int(rng.integers(1, 5))))
    n_terminals = 3 if kind == "random" and seed % 2 else 2
    table = random_table(rng, cards, kind=kind, n_terminals=n_terminals)
    terminals = ("a", "b", "c")[:n_terminals]
    diagram = diagram_from_table(table, terminals=terminals, positive="b")
    check_bijection(diagram, table)


def test_diagram_with_skipped_levels_is_encoded_exactly():
    # f(x) = x0 == 2 or (x2 == 1): the x0 == 2 edge jumps straight to the positive sink.
    table = np.zeros((3, 2, 2), dtype=np.int64)
    table[2] = 1
    table[:, :, 1] = 1
    diagram = diagram_from_table(table)
    levels = np.concatenate([[3, 3], diagram.node_level])
    valid = diagram.node_children >= 0
    jumps = (
        levels[diagram.node_children[valid]]
        - np.broadcast_to(diagram.node_level[:, None], valid.shape)[valid]
    )
    assert jumps.max() > 1
    check_bijection(diagram, table)


def test_constant_classifier_has_all_assignments_and_one_sink():
    table = np.ones((2, 3), dtype=np.int64)
    diagram = diagram_from_table(table)
    assert diagram.n_nodes == 0
    check_bijection(diagram, table)
    enc = encode_diagram(diagram)
    assert enumerate_models(enc.clauses, [enc.sink_literal("neg")]) == []


def test_decode_rejects_a_model_without_exactly_one_value():
    diagram = diagram_from_table(np.array([[0, 1], [1, 1]]))
    enc = encode_diagram(diagram)
    bad = [v for v in enc.feature_vars[0]] + [-v for v in enc.feature_vars[1]]
    with pytest.raises(ValueError, match="f0"):
        enc.decode(bad)


def test_copies_share_all_features_but_one_and_order_is_strict():
    rng = np.random.default_rng(3)
    cards = (3, 4, 2)
    table = random_table(rng, cards)
    diagram = diagram_from_table(table)
    order = (2, 0, 3, 1)  # a declared ordinal order that differs from index order
    copies, clauses = encode_copies(diagram, 2, free=1)
    clauses = clauses + strictly_increasing(copies[0], copies[1], 1, order)
    models = enumerate_models(clauses)
    pairs = sum(1 for a, b in itertools.combinations(range(4), 2))
    assert len(models) == 3 * 2 * pairs
    rank = {v: r for r, v in enumerate(order)}
    for m in models:
        lo, hi = copies[0].decode(m), copies[1].decode(m)
        assert lo[0] == hi[0] and lo[2] == hi[2]
        assert rank[int(lo[1])] < rank[int(hi[1])]
        for copy, x in ((copies[0], lo), (copies[1], hi)):
            sink = int(table[tuple(x)])
            assert copy.sink_literal(sink) in m


@pytest.mark.shared_data
@pytest.mark.parametrize("name", ["asia", "child"])
def test_real_network_encodings_are_exact(name):
    diagram, _ = compile_reference(name)
    check_bijection(diagram)


# ---------------------------------------------------------------------------- many states
@pytest.mark.parametrize("n_terminals", [2, PAIRWISE_LIMIT + 6])
def test_a_feature_or_class_past_the_pairwise_limit_keeps_models_one_to_one(n_terminals):
    """The prefix-OR chain that replaces pairwise at-most-one is determined by the values:
    still one model per assignment, the reached sink the only true one."""
    rng = np.random.default_rng(7)
    cards = (PAIRWISE_LIMIT + 6, 2)
    table = rng.integers(0, n_terminals, size=cards)
    diagram = diagram_from_table(
        table, terminals=[f"t{i}" for i in range(n_terminals)], positive="t1"
    )
    check_bijection(diagram, table)


def test_strict_order_past_the_pairwise_limit_keeps_models_one_to_one():
    rng = np.random.default_rng(5)
    card = PAIRWISE_LIMIT + 6
    cards = (2, card)
    table = random_table(rng, cards)
    diagram = diagram_from_table(table)
    order = tuple(int(v) for v in rng.permutation(card))
    copies, clauses = encode_copies(diagram, 2, free=1)
    clauses = clauses + strictly_increasing(copies[0], copies[1], 1, order)
    models = enumerate_models(clauses)
    assert len(models) == 2 * card * (card - 1) // 2
    rank = {v: r for r, v in enumerate(order)}
    for m in models[::97]:
        lo, hi = copies[0].decode(m), copies[1].decode(m)
        assert lo[0] == hi[0] and rank[int(lo[1])] < rank[int(hi[1])]


def test_encoding_grows_linearly_with_the_states():
    """5,000 states: tens of thousands of clauses, not 12.5 million."""
    table = np.arange(5_000).reshape(5_000, 1) % 2
    diagram = diagram_from_table(table)
    enc = encode_diagram(diagram)
    assert len(enc.clauses) < 30 * 5_000
    copies, _ = encode_copies(diagram, 2, free=0)
    assert len(strictly_increasing(copies[0], copies[1], 0, range(5_000))) < 5 * 5_000
