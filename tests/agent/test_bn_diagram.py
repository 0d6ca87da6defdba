"""The runtime decision diagram: canonical form, evaluation, counting, encoding, serialisation.

Every expectation is computed here by brute force from a random truth table, never taken
from the diagram code itself.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from boxwatch.agent import diagram as diagram_mod
from boxwatch.agent.artifact import build_artifact_bytes, load_artifact
from boxwatch.agent.diagram import DecisionDiagram, RecordError
from boxwatch.agent.errors import ArtifactError
from boxwatch.agent.keys import key_id


def random_table(seed: int, cards: list[int], n_terminals: int = 2) -> np.ndarray:
    """A random labelling with some irrelevant levels and repeated sub-tables."""
    rng = np.random.default_rng(seed)
    table = rng.integers(0, n_terminals, size=cards)
    if len(cards) > 2:
        skip = int(rng.integers(1, len(cards)))
        idx = [slice(None)] * len(cards)
        idx[skip] = slice(0, 1)
        table = np.repeat(table[tuple(idx)], cards[skip], axis=skip)
    return table


def full_tree(table: np.ndarray, n_terminals: int) -> tuple[list[int], list[list[int]], int]:
    """An unreduced tree diagram of ``table``: one node per prefix."""
    cards = table.shape
    width = max(cards)
    levels: list[int] = []
    children: list[list[int]] = []

    def build(prefix: tuple[int, ...]) -> int:
        if len(prefix) == len(cards):
            return int(table[prefix])
        kids = [build((*prefix, v)) for v in range(cards[len(prefix)])]
        levels.append(len(prefix))
        children.append(kids + [-1] * (width - len(kids)))
        return n_terminals + len(levels) - 1

    root = build(())
    return levels, children, root


def make(table: np.ndarray, levels, children, root, terminals=("no", "yes")) -> DecisionDiagram:
    return DecisionDiagram.canonical(
        features=[f"f{i}" for i in range(table.ndim)],
        states=[[f"s{j}" for j in range(c)] for c in table.shape],
        terminals=list(terminals),
        node_level=levels,
        node_children=children,
        root=root,
        class_variable="C",
        positive=terminals[-1],
        threshold=0.5,
    )


def all_inputs(cards) -> np.ndarray:
    return np.array(list(itertools.product(*[range(c) for c in cards])), dtype=np.int64)


def brute_nodes_per_level(table: np.ndarray) -> tuple[list[int], list[int]]:
    """(reduced, quasi-reduced) internal nodes per level, by listing every sub-table."""
    n = table.ndim
    quasi = [0] * n
    reduced_keys: set[tuple[int, bytes, tuple[int, ...]]] = set()
    for m in range(n):
        slices = {table[u].tobytes() + bytes(table[u].shape) for u in np.ndindex(table.shape[:m])}
        quasi[m] = len(slices)
        for u in np.ndindex(table.shape[:m]):
            s = table[u]
            top = next((i for i in range(s.ndim) if not (s == s.take([0], axis=i)).all()), None)
            if top is None:
                continue
            core = s[(0,) * top]
            reduced_keys.add((m + top, core.tobytes(), core.shape))
    reduced = [sum(1 for k in reduced_keys if k[0] == lvl) for lvl in range(n)]
    return reduced, quasi


@pytest.mark.parametrize("seed", range(12))
def test_canonical_diagram_matches_truth_table(seed):
    rng = np.random.default_rng(100 + seed)
    cards = [int(c) for c in rng.integers(1, 5, size=int(rng.integers(1, 6)))]
    nt = int(rng.integers(2, 4))
    table = random_table(seed, cards, nt)
    d = make(table, *full_tree(table, nt), terminals=[f"t{i}" for i in range(nt)])
    X = all_inputs(cards)
    assert np.array_equal(d.predict(X), table.reshape(-1))
    counts = d.counts()
    assert [counts[f"t{i}"] for i in range(nt)] == [int((table == i).sum()) for i in range(nt)]
    reduced, quasi = brute_nodes_per_level(table)
    assert list(d.nodes_per_level) == reduced
    assert list(d.quasi_nodes_per_level()) == quasi
    assert d.is_canonical()


@pytest.mark.parametrize("seed", range(6))
def test_equal_functions_give_equal_arrays_whatever_the_numbering(seed):
    cards = [3, 2, 4, 2]
    table = random_table(seed, cards)
    levels, children, root = full_tree(table, 2)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(levels))
    inv = np.argsort(perm)
    ch = np.array(children)[perm]
    ch = np.where(ch >= 2, inv[np.maximum(ch - 2, 0)] + 2, ch)
    a = make(table, levels, children, root)
    b = make(table, np.array(levels)[perm], ch, int(inv[root - 2]) + 2)
    assert a == b
    flipped = table.copy()
    flipped.reshape(-1)[0] ^= 1
    assert not make(flipped, *full_tree(flipped, 2)).same_function(a)


def test_nodes_are_numbered_by_level_then_breadth_first():
    table = random_table(3, [2, 3, 2, 3])
    d = make(table, *full_tree(table, 2))
    assert (np.diff(d.node_level) >= 0).all()
    assert d.root == d.n_terminals
    lv = np.concatenate([np.full(2, d.n_features), d.node_level])
    valid = d.node_children >= 0
    assert (lv[np.where(valid, d.node_children, 0)] > d.node_level[:, None])[valid].all()


def test_constant_classifier_is_a_sink():
    table = np.ones((3, 2, 2), dtype=np.int64)
    d = make(table, *full_tree(table, 2))
    assert d.root == 1 and d.n_nodes == 0
    assert d.counts() == {"no": 0, "yes": 12}
    assert d.n_nodes_quasi == 3
    assert np.array_equal(d.predict(all_inputs([3, 2, 2])), np.ones(12))


@pytest.mark.parametrize("seed", range(3))
def test_counts_of_thousands_of_sinks_take_one_pass(seed):
    """An argmax diagram has a sink per class state: counting every sink is one pass over
    the diagram, not one per sink (8,000 sinks: milliseconds, was seconds)."""
    rng = np.random.default_rng(seed)
    nt = 8_000
    table = rng.integers(0, nt, size=(40, 3, 2))
    d = make(table, *full_tree(table, nt), terminals=[f"t{i}" for i in range(nt)])
    start = time.perf_counter()
    counts = d.counts()
    assert time.perf_counter() - start < 1.0
    expected = np.bincount(table.reshape(-1), minlength=nt)
    assert [counts[f"t{i}"] for i in range(nt)] == expected.tolist()


def test_counts_are_exact_past_2_to_the_63():
    # f = x0 AND x69 over 70 binary levels: a chain skipping 68 levels.
    d = DecisionDiagram.canonical(
        features=[f"x{i}" for i in range(70)],
        states=[["0", "1"]] * 70,
        terminals=["no", "yes"],
        node_level=[0, 69],
        node_children=[[0, 3], [0, 1]],
        root=2,
        class_variable="C",
        positive="yes",
        threshold=0.5,
    )
    assert d.count("yes") == 2**68
    assert d.count(0) == 2**70 - 2**68
    # quasi-reduced: the root, then two nodes (x69's test and the 'no' chain) per level
    assert d.n_nodes_quasi == 1 + 2 * 69


def test_predict_rejects_bad_indices():
    table = random_table(1, [2, 3])
    d = make(table, *full_tree(table, 2))
    with pytest.raises(ValueError, match=r"X\[1, 1\] = 3 is not a state index of 'f1'"):
        d.predict([[0, 0], [1, 3]])
    with pytest.raises(ValueError, match="expected"):
        d.predict(np.zeros((2, 3), dtype=int))
    with pytest.raises(ValueError, match="integer"):
        d.predict(np.zeros((2, 2)))


def test_encode_maps_names_and_names_the_bad_record():
    table = random_table(2, [2, 3, 2])
    d = make(table, *full_tree(table, 2))
    records = [{"f0": "s1", "f1": "s2", "f2": "s0"}, {"f0": "s0", "f1": "s0", "f2": "s1"}]
    X = d.encode(records)
    assert X.tolist() == [[1, 2, 0], [0, 0, 1]]
    assert np.array_equal(d.predict_labels(X), np.array(["no", "yes"])[table[tuple(X.T)]])
    with pytest.raises(RecordError, match=r"record 1: feature 'f1' has state 's9'") as info:
        d.encode([records[0], {"f0": "s0", "f1": "s9", "f2": "s1"}])
    assert (info.value.record, info.value.variable, info.value.state) == (1, "f1", "s9")
    with pytest.raises(RecordError, match=r"record 0: feature 'f2' is missing"):
        d.encode([{"f0": "s0", "f1": "s0"}])
    with pytest.raises(RecordError, match="record 0: feature 'f0' has state"):
        d.encode([{"f0": ["s0"], "f1": "s0", "f2": "s0"}])
    # A key that is not a feature is an error, as the agent dead-letters it (issue 28).
    with pytest.raises(RecordError, match=r"record 0: \['C'\] not features") as info:
        d.encode([{**records[0], "C": "x"}])
    assert info.value.reason == "unknown_variable"


def test_members_round_trip_through_a_signed_artifact():
    table = random_table(4, [3, 2, 4, 2])
    d = make(table, *full_tree(table, 2))
    key = Ed25519PrivateKey.generate()
    blob = build_artifact_bytes(d.to_members("bn/"), private_key=key, created_at=0)
    art = load_artifact(blob, {key_id(key.public_key()): key.public_key()})
    back = DecisionDiagram.from_members(art.json("bn/diagram.json"), art.arrays("bn/diagram.npz"))
    assert back == d
    X = all_inputs([3, 2, 4, 2])
    assert np.array_equal(back.predict(X), table.reshape(-1))


def _tampered(d: DecisionDiagram, **changes):
    members = d.to_members()
    meta = dict(members["bn/diagram.json"])
    arrays = {k: v.copy() for k, v in members["bn/diagram.npz"].items()}
    for key, value in changes.items():
        if key in arrays:
            arrays[key] = value(arrays[key])
        else:
            meta[key] = value
    return meta, arrays


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"schema": "other"}, "schema"),
        ({"root": 10_000}, "root"),
        ({"positive": "maybe"}, "positive"),
        ({"states": [["a"]]}, "states"),
        ({"node_children": lambda a: a[:, :1]}, "shape"),
        ({"node_level": lambda a: np.full_like(a, 99)}, "levels"),
        ({"node_children": lambda a: np.where(a >= 0, 10_000, a)}, "child ids"),
        (
            {"node_children": lambda a: np.where(np.arange(a.size).reshape(a.shape) == 0, 2, a)},
            "deeper level",
        ),
        ({"node_children": lambda a: np.where(a >= 0, 0, a)}, "canonical"),
    ],
)
def test_from_members_rejects_malformed_members(changes, message):
    table = random_table(5, [3, 2, 4, 2])
    d = make(table, *full_tree(table, 2))
    meta, arrays = _tampered(d, **changes)
    with pytest.raises(ArtifactError, match=message):
        DecisionDiagram.from_members(meta, arrays)


def test_predict_is_vectorised_over_large_batches():
    table = random_table(6, [4, 4, 4, 4, 4, 4])
    d = make(table, *full_tree(table, 2))
    rng = np.random.default_rng(0)
    X = rng.integers(0, 4, size=(50_000, 6))
    assert np.array_equal(d.predict(X), table[tuple(X.T)])
    assert np.array_equal(d.predict_positive(X), table[tuple(X.T)] == 1)


def test_predict_accepts_state_names_and_records():
    table = random_table(7, [2, 3, 2])
    d = make(table, *full_tree(table, 2))
    X = all_inputs([2, 3, 2])
    names = np.array([[d.states[i][x[i]] for i in range(3)] for x in X])
    records = [dict(zip(d.features, row, strict=True)) for row in names.tolist()]
    assert np.array_equal(d.predict(names), table.reshape(-1))
    assert np.array_equal(d.predict(records), table.reshape(-1))
    names[4, 2] = "zz"
    with pytest.raises(RecordError, match=r"record 4: feature 'f2' has state 'zz'"):
        d.predict(names)


@pytest.mark.parametrize(
    ("shape", "high", "dtype"),
    [
        ((5000, 2), 2, np.uint8),
        ((3000, 2), 40, np.int64),
        ((400, 3), 6, np.int16),
        ((900, 2), 300, np.int64),
    ],
)
def test_unique_rows_counted_and_sorted_agree(monkeypatch, shape, high, dtype):
    rows = np.random.default_rng(0).integers(-1, high, size=shape).astype(dtype)
    if dtype == np.uint8:
        rows = np.abs(rows).astype(dtype)
    uniq, inverse = diagram_mod.unique_rows(rows)
    assert uniq.dtype == np.int64 and inverse.dtype == np.int64
    assert (uniq[inverse] == rows).all()
    assert (np.diff([tuple(r) for r in uniq], axis=0) != 0).any(axis=1).all()  # distinct
    monkeypatch.setattr(diagram_mod, "_DENSE_KEYS", 0)  # force the sorting path
    sorted_uniq, sorted_inverse = diagram_mod.unique_rows(rows)
    assert (uniq == sorted_uniq).all() and (inverse == sorted_inverse).all()
