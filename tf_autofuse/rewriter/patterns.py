"""User patterns: rules that claim subgraphs before the automatic partitioner runs.

For every node, in topological order, that no pattern has claimed yet, each registered pattern
(in registration order) is asked `match(graph, node)`: the names of the nodes it covers, or None.
Its `fuse(graph, nodes)` then decides:

  a name (str)      the nodes become one fused kernel `autofuse_pattern_<n>_<name>`, lowered like
                    any other group (so it runs on every backend), if the nodes can be one
                    program: each must be fusible on its own (catalog op, CPU, not fed, not inside
                    disable_autofuse() or the skip list), together they must sit on one device,
                    not close a cycle and lower; otherwise the match is refused with the reason;
  Pattern.FORBID    the nodes are never fused, neither by patterns nor by the partitioner;
  None              nothing: the nodes stay for the partitioner.

Claimed and forbidden nodes are then left out of the automatic partitioner
(partition.Policy.excluded). A pattern whose match() or fuse() raises, or returns something that
is not node names or a valid name, is skipped for the rest of the graph with one AutofuseWarning:
a user pattern never breaks the pass.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Optional, Sequence

from .._warn import warn_once
from . import catalog
from .graph import GraphView, Shape, tensor_name
from .lower import Lowered, Unfusible, build

_NAME = re.compile(r"^[A-Za-z0-9]+(?:_[A-Za-z0-9]+)*$")


class _Forbid:
    def __repr__(self) -> str:
        return "Pattern.FORBID"


class Pattern:
    """Base class of user patterns; see the module docstring and docs/API.md (patterns).

    Subclass it, set `name` (the kernel name's suffix; default: the class name) and implement
    `match`; override `fuse` to forbid fusion or to name kernels per match.
    """

    FORBID = _Forbid()
    name: Optional[str] = None

    def match(self, graph: "PatternGraph", node: str) -> Optional[Iterable[str]]:
        """The names of the nodes this pattern covers when `node` is where it starts, or None."""
        raise NotImplementedError(f"{type(self).__name__}.match")

    def fuse(self, graph: "PatternGraph", nodes: Sequence[str]):
        """What to do with a match: a name (one kernel), Pattern.FORBID, or None."""
        return self.label()

    def label(self) -> str:
        return self.name or type(self).__name__

    def __repr__(self) -> str:
        return f"<{type(self).__name__} pattern {self.label()!r}>"


class PatternGraph:
    """What a pattern sees: a read-only view of the graph being fused (node names are str)."""

    def __init__(self, view: GraphView):
        self._view = view

    @property
    def nodes(self) -> list:
        """Every node name, in topological order."""
        return list(self._view.order)

    def __contains__(self, name: str) -> bool:
        return name in self._view

    def node(self, name: str):
        """The NodeDef (read it, never change it)."""
        return self._view.node(name)

    def op(self, name: str) -> str:
        return self._view.node(name).op

    def inputs(self, name: str) -> list:
        """The data inputs, as tensor names: 'a' for output 0 of node a, 'a:1' for output 1."""
        return [tensor_name(t) for t in self._view.data_inputs(name)]

    def consumers(self, name: str) -> list:
        """The nodes reading any output of `name` through a data edge, each once."""
        return list(dict.fromkeys(c for c, _, _ in self._view.data_consumers(name)))

    def shape(self, name: str, index: int = 0) -> Shape:
        """Static shape of an output (tuple, -1 or a negative symbol for unknown sizes), or None."""
        return self._view.output_shape(name, index)

    def dtype(self, name: str, index: int = 0):
        """The tf.DType of an output, or None when the graph does not tell."""
        from tensorflow.python.framework import dtypes

        enum = self._view.output_dtype(name, index)
        return None if enum is None else dtypes.as_dtype(enum)

    def device(self, name: str) -> str:
        return self._view.device(name)


@dataclasses.dataclass(frozen=True)
class Claim:
    pattern: str  # the pattern's label
    suffix: str  # the kernel name's suffix
    members: tuple  # node names, topological order
    lowered: Lowered


class _Skip(Exception):
    """The pattern misbehaved; the message says how."""


def _node_names(found, view: GraphView) -> tuple:
    if isinstance(found, str):
        found = [found]
    try:
        names = list(found)
    except TypeError:
        raise _Skip(f"match() returned {found!r}, not node names") from None
    if not all(isinstance(n, str) for n in names):
        raise _Skip(f"match() returned {names!r}, not node names")
    missing = [n for n in names if n not in view]
    if missing:
        raise _Skip(f"match() returned {missing[0]!r}, which is not a node of the graph")
    if len(set(names)) != len(names):
        raise _Skip(f"match() returned a node twice: {names!r}")
    return tuple(sorted(names, key=view.position.get))


def _legal(view: GraphView, nodes: tuple, policy, absorbable) -> tuple:
    """(reason, None) when the nodes cannot be one kernel, else (None, lowered)."""
    from .partition import _cycle_through, _refuse_candidate  # one rule for both

    candidate_policy = dataclasses.replace(policy, reduce=True)  # a pattern may claim reductions
    candidates = catalog.candidate_op_types()
    for name in nodes:
        if view.node(name).op not in candidates:
            return f"{name}: {view.node(name).op} is not an op tf_autofuse can fuse", None
        reason = _refuse_candidate(view, name, policy.feeds, candidate_policy)
        if reason is not None:
            return f"{name}: {reason}", None
    devices = sorted({view.device(name) for name in nodes})
    if len(devices) > 1:
        return f"the nodes are placed on different devices ({', '.join(map(repr, devices))})", None
    through = _cycle_through(view, set(nodes))
    if through is not None:
        return f"the nodes would create a cycle through {through}", None
    try:
        return None, build(view, list(nodes), policy.preserve, absorbable=absorbable,
                           feeds=policy.feeds)
    except Unfusible as err:
        return str(err), None


def apply_patterns(view: GraphView, patterns: Sequence[Pattern], policy, absorbable=None):
    """Run the patterns over the graph. Returns (claims, excluded {node: reason}, refusals)."""
    from .partition import Refusal

    claims: list[Claim] = []
    excluded: dict[str, str] = {}
    refusals: list = []
    active = list(patterns)
    graph = PatternGraph(view)

    def drop(pattern, label, message):
        warn_once(f"pattern {label} is skipped for this graph: {message}")
        if pattern in active:
            active.remove(pattern)

    for node in view.order:
        for pattern in list(active):
            if node in excluded:
                break
            label = _label(pattern)
            try:
                found = pattern.match(graph, node)
                if found is None:
                    continue
                nodes = _node_names(found, view)
                if not nodes:
                    continue
                taken = [n for n in nodes if n in excluded]
                if taken:
                    refusals.append(Refusal(node, f"pattern {label}: {taken[0]} is claimed or "
                                                  f"forbidden by an earlier match"))
                    continue
                decision = pattern.fuse(graph, list(nodes))
            except _Skip as err:
                drop(pattern, label, str(err))
                continue
            except Exception as err:  # noqa: BLE001 - a user pattern never breaks the pass
                drop(pattern, label, f"it raised {type(err).__name__}: {err}")
                continue
            if decision is None:
                continue
            if decision is Pattern.FORBID:
                for name in nodes:
                    excluded[name] = f"forbidden by pattern {label}"
                continue
            if not isinstance(decision, str) or not _NAME.match(decision):
                drop(pattern, label, f"fuse() returned {decision!r}; it returns a kernel name "
                                     f"(letters, digits, single underscores), Pattern.FORBID "
                                     f"or None")
                continue
            reason, lowered = _legal(view, nodes, policy, absorbable)
            if reason is not None:
                refusals.append(Refusal(node, f"pattern {label}: {reason}"))
                continue
            claims.append(Claim(label, decision, nodes, lowered))
            for name in nodes:
                excluded[name] = ""  # claimed: silently left out of the partitioner
    return claims, excluded, refusals


def _label(pattern) -> str:
    try:
        return str(pattern.label())
    except Exception:  # noqa: BLE001
        return type(pattern).__name__
