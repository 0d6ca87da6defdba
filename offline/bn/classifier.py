"""The classifier a Bayesian network defines: class, decision, features, order.

Two decisions (``decision``):

* ``threshold`` (default): ``positive`` iff ``P(class = positive | features) >= threshold``;
* ``argmax``: the most probable class state, ``argmax_c P(class = c | features)``; states
  whose posteriors tie (within the compiler's tie tolerance) go to the lowest state index in
  the network's order. No positive state, no threshold.

Everything not a feature is summed out. :func:`resolve_spec` validates a user's :class:`ClassifierSpec`
against a network (all problems at once) and fills in the defaults.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from boxwatch.agent.diagram import ARGMAX, DECISIONS, THRESHOLD
from boxwatch.agent.errors import ConfigError
from boxwatch.offline.bn.limits import Deadline
from boxwatch.offline.bn.network import Network
from boxwatch.offline.bn.separator import prefix_side

_SCALE = 1 << 20
FRONTIER_MAX_INPUTS = 1 << 62
"""Past this many inputs no route can finish (the separator's time per input alone makes
millennia), so :func:`default_order` does not search for a cheaper order than depth-first
(quadratic in the features)."""


@dataclass(frozen=True)
class ClassifierSpec:
    """What the user asks for; ``None`` fields take the documented defaults.

    Parameters
    ----------
    class_variable : str
    positive : str, optional
        Name of the positive state of ``class_variable`` (threshold decisions only).
    threshold : float, optional
        In (0, 1): decide positive iff ``P(class = positive | x) >= threshold`` (threshold
        decisions only).
    features : sequence of str, optional
        Default: all leaves of the network; when the class itself is a leaf, all other
        variables.
    order : sequence of str, optional
        The variable order of the diagram (a permutation of the features). Default:
        :func:`default_order`.
    decision : {"threshold", "argmax"}
        ``argmax`` decides the most probable class state and takes neither ``positive``
        nor ``threshold``.
    """

    class_variable: str
    positive: str | None = None
    threshold: float | None = None
    features: Sequence[str] | None = None
    order: Sequence[str] | None = None
    decision: str = THRESHOLD


@dataclass(frozen=True)
class ResolvedSpec:
    """A validated spec: ``order`` lists the features in diagram order.

    ``positive`` and ``threshold`` are ``None`` for an argmax decision.
    """

    class_variable: str
    positive: str | None
    threshold: float | None
    order: tuple[str, ...]
    decision: str = THRESHOLD

    @property
    def is_argmax(self) -> bool:
        """True for a multi-class (argmax) decision."""
        return self.decision == ARGMAX

    @property
    def features(self) -> tuple[str, ...]:
        """The feature variables, in diagram order."""
        return self.order


def default_features(network: Network, class_variable: str) -> tuple[str, ...]:
    """All leaves (file order); when the class is a leaf, every other variable (file order)."""
    leaves = network.leaves()
    if class_variable in leaves:
        return tuple(v for v in network.variables if v != class_variable)
    return leaves


def default_order(
    network: Network,
    class_variable: str,
    features: Sequence[str],
    deadline: Deadline | None = None,
) -> tuple[str, ...]:
    """Deterministic default order: the depth-first order or the frontier order, whichever
    has the cheaper cuts.

    Both candidates are scored by :func:`cut_cost` (the states of the smallest separator
    between each prefix and the rest, summed over the cuts); the frontier order
    (:func:`frontier_order`) replaces the depth-first one (:func:`dfs_order`) only when it is
    strictly cheaper, so a network where the depth-first order is as good keeps it. Without
    hidden variables (every relevant variable is the class or a feature) the cuts hold no
    hidden states, and past :data:`FRONTIER_MAX_INPUTS` inputs no route can finish: the
    depth-first order is kept without scoring. ``deadline`` is checked as the frontier
    order is built and scored.
    """
    dfs = dfs_order(network, class_variable, features)
    keep = {class_variable, *features}
    if len(dfs) < 3 or network.ancestors([*keep]) == keep:
        return dfs
    if math.prod(network.card(f) for f in features) > FRONTIER_MAX_INPUTS:
        return dfs
    frontier = frontier_order(network, class_variable, features, deadline)
    if frontier == dfs:
        return dfs
    cost = cut_cost(network, class_variable, frontier, deadline)
    if cost < cut_cost(network, class_variable, dfs, deadline):
        return frontier
    return dfs


def dfs_order(network: Network, class_variable: str, features: Sequence[str]) -> tuple[str, ...]:
    """Features by first visit of a depth-first search.

    The search starts at the class variable and walks the undirected network graph,
    visiting neighbours as parents first, then children, each in file order. Features
    hanging off the same branch end up adjacent, which keeps the interface between the
    tested prefix and the rest small (small diagrams, fast decomposition).
    """
    wanted = set(features)
    seen: set[str] = set()
    out: list[str] = []
    stack = [class_variable]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in wanted:
            out.append(v)
        nbrs = [*network.parents[v], *network.children(v)]
        stack.extend(reversed([u for u in nbrs if u not in seen]))
    out.extend(f for f in network.variables if f in wanted and f not in seen)
    return tuple(out)


def frontier_order(
    network: Network,
    class_variable: str,
    features: Sequence[str],
    deadline: Deadline | None = None,
) -> tuple[str, ...]:
    """Greedy order that keeps the frontier of open hidden variables small.

    Depth-first search strands features on networks where many hidden roots each point at
    a few features (QMR-like networks such as tcc4e): the features sharing a root end up far
    apart and the cut between a prefix and the rest holds many roots. Here each feature's
    *hidden neighbours* are its neighbours in the moral graph that are neither features nor
    the class; the *frontier* of a prefix is the hidden neighbours of its features that are
    also hidden neighbours of a feature still to come (they must be kept in any message
    between the two). The features in the class's Markov blanket come first (once the
    class's child features are in, fewer CPTs past the cut mention the class, which lets
    the jointree route decide partial inputs early), then the rest;
    within each group the next feature is the one leaving the smallest frontier (summed
    ``log(states)``), ties broken by the most hidden neighbours already seen, then by the
    depth-first order. Deterministic: the weights are integers (``log(states)`` scaled), so
    no sum depends on the order a set is walked in.
    """
    dfs = dfs_order(network, class_variable, features)
    rank = {f: i for i, f in enumerate(dfs)}
    wanted = set(features)
    hidden = {f: _hidden_neighbours(network, f, class_variable, wanted) for f in dfs}
    weight = {h: round(math.log(network.card(h)) * _SCALE) for hs in hidden.values() for h in hs}
    pending: dict[str, int] = {}
    for hs in hidden.values():
        for h in hs:
            pending[h] = pending.get(h, 0) + 1
    blanket = _hidden_neighbours(network, class_variable, None, set()) & wanted
    groups = [[f for f in dfs if f in blanket], [f for f in dfs if f not in blanket]]
    opened: set[str] = set()
    out: list[str] = []
    for group in groups:
        rest = list(group)
        while rest:
            if deadline is not None:
                deadline.check(f"the frontier order: {len(out):,} of {len(dfs):,} features")
            best = min(
                rest, key=lambda f: _frontier_score(f, hidden, opened, pending, weight, rank)
            )
            rest.remove(best)
            out.append(best)
            opened |= hidden[best]
            for h in hidden[best]:
                pending[h] -= 1
    return tuple(out)


def _frontier_score(
    f: str,
    hidden: dict[str, set[str]],
    opened: set[str],
    pending: dict[str, int],
    weight: dict[str, int],
    rank: dict[str, int],
) -> tuple[int, int, int]:
    """Rank of ``f`` as the next feature of :func:`frontier_order` (smallest first): the
    frontier it leaves, minus the hidden neighbours already seen, then depth-first rank."""
    left = sum(weight[h] for h in opened | hidden[f] if pending[h] - (h in hidden[f]) > 0)
    return (left, -len(hidden[f] & opened), rank[f])


def _hidden_neighbours(
    network: Network, var: str, class_variable: str | None, features: set[str]
) -> set[str]:
    """Moral-graph neighbours of ``var`` (parents, children, the children's other parents)
    other than ``var``, the class and the features."""
    near = set(network.parents[var])
    for child in network.children(var):
        near.add(child)
        near.update(network.parents[child])
    near.discard(var)
    if class_variable is not None:
        near.discard(class_variable)
    return near - features


def cut_cost(
    network: Network,
    class_variable: str,
    order: Sequence[str],
    deadline: Deadline | None = None,
) -> int:
    """Sum over the cuts of ``order`` (after 1 .. n-1 features) of the states of the
    minimum vertex separator between the prefix and the rest in the moral graph
    (:func:`~boxwatch.offline.bn.separator.prefix_side`, the class left out).

    The messages of the separator and jointree routes are as large as these separators, so
    an order with cheaper cuts has cheaper routes. Computed from the CPT scopes alone.
    """
    order = list(order)
    relevant = network.ancestors([class_variable, *order])
    scopes = [(*network.parents[v], v) for v in network.variables if v in relevant]
    total = 0
    for k in range(1, len(order)):
        if deadline is not None:
            deadline.check(f"scoring an order: cut {k:,} of {len(order) - 1:,}")
        _, cut = prefix_side(network, scopes, class_variable, order[:k], order[k:])
        total += math.prod(network.card(v) for v in cut)
    return total


def resolve_spec(
    network: Network, spec: ClassifierSpec, *, deadline: Deadline | None = None
) -> ResolvedSpec:
    """Validate ``spec`` against ``network`` and fill in defaults (``deadline`` checked
    while the default order is chosen).

    Raises
    ------
    ConfigError
        Listing every problem: unknown class or state, threshold outside (0, 1), a positive
        state or threshold given to an argmax decision, unknown or
        repeated features, the class among the features, an order that is not a
        permutation of the features.
    """
    problems: list[str] = []
    where = network.source
    cls = spec.class_variable
    argmax = spec.decision == ARGMAX
    if spec.decision not in DECISIONS:
        problems.append(f"decision {spec.decision!r} must be one of {', '.join(DECISIONS)}")
    if cls not in network.states:
        problems.append(f"{where}: class variable {cls!r} is not in the network")
    elif len(network.states[cls]) < 2:
        problems.append(f"{where}: class variable {cls!r} has a single state")
    elif not argmax and spec.positive not in network.states[cls]:
        problems.append(
            f"{where}: positive state {spec.positive!r} is not a state of {cls!r} "
            f"{list(network.states[cls])}"
        )
    threshold: float | None = None
    if argmax:
        pairs = (("positive", spec.positive), ("threshold", spec.threshold))
        given = [name for name, value in pairs if value is not None]
        if given:
            problems.append(
                f"an argmax decision takes no {' or '.join(given)} "
                "(they apply to threshold decisions only)"
            )
    else:
        try:
            threshold = float(spec.threshold)  # type: ignore[arg-type]  # a bad value is refused below
        except (TypeError, ValueError):
            threshold = float("nan")
        if not 0.0 < threshold < 1.0:
            problems.append(f"threshold {spec.threshold!r} must lie strictly between 0 and 1")
    if spec.features is not None:
        features = tuple(spec.features)
        unknown = [f for f in features if f not in network.states]
        if unknown:
            problems.append(f"{where}: features not in the network: {unknown}")
        dup = sorted(f for f, n in Counter(features).items() if n > 1)
        if dup:
            problems.append(f"features listed more than once: {dup}")
        if cls in features:
            problems.append(f"the class variable {cls!r} cannot also be a feature")
        if not features:
            problems.append("the feature list is empty")
    elif cls in network.states:
        features = default_features(network, cls)
        if not features:
            problems.append(
                f"{where}: the network has no feature variables besides the class {cls!r}; "
                "a classifier needs at least one feature"
            )
    else:
        features = ()
    order: tuple[str, ...] = ()
    if spec.order is not None:
        order = tuple(spec.order)
        if sorted(order) != sorted(features):
            in_order, in_features = set(order), set(features)
            missing = [f for f in features if f not in in_order]
            extra = [f for f in order if f not in in_features]
            problems.append(
                "order must list each feature exactly once"
                + (f"; missing {missing}" if missing else "")
                + (f"; not features {extra}" if extra else "")
                + ("; repeated entries" if len(set(order)) != len(order) else "")
            )
    if problems:
        raise ConfigError(problems)
    if spec.order is None:
        order = default_order(network, cls, features, deadline)
    return ResolvedSpec(
        class_variable=cls,
        positive=None if argmax else spec.positive,
        threshold=threshold,
        order=order,
        decision=spec.decision,
    )
