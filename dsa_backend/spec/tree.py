"""Draft trees: their shape, and EAGLE's best-first choice of which drafted nodes to verify.

Node 0 is the root, the request's last verified token; nodes 1.. are draft tokens, each after its
parent (parents[i - 1] < i), so every root-to-leaf path has increasing node ids and the accepted
path can only move towards the front when it is compacted. A chain is the tree whose node i has
parent i - 1.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from dsa_backend.batch import TreeLayout


@dataclass(frozen=True)
class DraftTree:
    tokens: tuple[int, ...]    # node i >= 1 holds tokens[i - 1]
    parents: tuple[int, ...]   # and hangs under parents[i - 1] < i

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"{len(self.tokens)} draft tokens but {len(self.parents)} parents")
        if any(not 0 <= p < i for i, p in enumerate(self.parents, 1)):
            raise ValueError(f"every draft node needs an earlier parent, got parents {self.parents}")

    @classmethod
    def chain(cls, tokens) -> "DraftTree":
        return cls(tuple(tokens), tuple(range(len(tokens))))

    @property
    def num_drafts(self) -> int:
        return len(self.tokens)

    @property
    def unread(self) -> bool:
        """Whether the tokens are still on the GPU: each named -1 - its index in the drafting
        step's tokens (spec/drafter.ChainDrafts), as Sequence.token_ids names unread tokens."""
        return bool(self.tokens) and self.tokens[0] < 0

    @property
    def num_nodes(self) -> int:
        return 1 + len(self.tokens)

    def token(self, node: int) -> int:
        return self.tokens[node - 1]

    @functools.cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """children[node]: its child node ids, in node order (the drafter's rank order)."""
        kids: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for node, parent in enumerate(self.parents, 1):
            kids[parent].append(node)
        return tuple(tuple(k) for k in kids)

    @functools.cached_property
    def ancestors(self) -> tuple[tuple[int, ...], ...]:
        """ancestors[node]: node ids from the root down to the node itself."""
        out: list[tuple[int, ...]] = [(0,)]
        for node, parent in enumerate(self.parents, 1):
            out.append(out[parent] + (node,))
        return tuple(out)

    def path_tokens(self, node: int) -> list[int]:
        """The draft tokens from the root (excluded) down to node (included)."""
        return [self.token(a) for a in self.ancestors[node][1:]]

    def layout(self) -> TreeLayout:
        """Every node, root first, as the verify forward lays them out."""
        return TreeLayout(self.ancestors)


ROOT_ONLY = DraftTree((), ())


def best_first_tree(tokens: list[int], scores: list[float], parents: list[int], size: int) -> DraftTree:
    """EAGLE's selection: the `size` drafted candidates of highest cumulative draft log-probability.

    Candidates come in generation order (a parent before its children; parents[c] = -1 under the
    root). A child's score never exceeds its parent's and ties keep generation order, so the best
    candidates already include their ancestors; a candidate whose parent was not taken is skipped
    all the same, so the result is always a tree.
    """
    order = sorted(range(len(tokens)), key=lambda c: -scores[c])
    chosen: set[int] = set()
    for c in order:
        if len(chosen) == size:
            break
        if parents[c] < 0 or parents[c] in chosen:
            chosen.add(c)
    kept = sorted(chosen)
    node_of = {c: i for i, c in enumerate(kept, 1)}
    return DraftTree(tuple(tokens[c] for c in kept), tuple(node_of.get(parents[c], 0) for c in kept))
