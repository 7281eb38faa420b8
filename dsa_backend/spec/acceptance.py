"""Accepting draft tokens against the target distribution, losslessly, along a draft tree.

Drafts are deterministic (the MTP layer's top tokens), so each child's draft distribution is
one-hot. At a node with target distribution p and children c1, c2, ... (distinct tokens), the
multi-candidate rejection rule of SpecInfer accepts c1 with probability p(c1); on rejection p loses
c1 and is renormalized, and c2 is tried against that residual, and so on; when every child is
rejected the token is sampled from the final residual. Each token x then comes out with
probability exactly p(x), and an accepted child repeats the rule one level down with its own
target row. A chain is the tree of one child per node (plain speculative sampling); greedy rows
have a one-hot p, which makes this "follow the child that equals the target's argmax".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dsa_backend.spec.tree import DraftTree


def accept_greedy(argmax: Sequence[int], tree: DraftTree) -> tuple[list[int], list[int]]:
    """accept_tree for a greedy request, from each node's target argmax already on the host.

    A greedy target row is one-hot at its argmax, so the rule follows the child holding that token
    (child tokens are distinct) and emits the argmax where none does: the same result as
    accept_tree on one-hot rows, without a device round trip per child.
    """
    node, path = 0, []
    while True:
        child = next((c for c in tree.children[node] if tree.token(c) == argmax[node]), None)
        if child is None:
            return path, [tree.token(a) for a in path] + [argmax[node]]
        path.append(child)
        node = child


def accept_tree(probs: torch.Tensor, tree: DraftTree,
                generator: torch.Generator | None) -> tuple[list[int], list[int]]:
    """probs [tree.num_nodes, vocab]: the target distribution after each node ->
    (accepted node ids, root excluded; emitted tokens: theirs, then one sampled from the target)."""
    node, path = 0, []
    while True:
        residual = probs[node].clone()
        for child in tree.children[node]:
            token = tree.token(child)
            u = torch.rand((), generator=generator, device=probs.device)
            if u * residual.sum() < residual[token]:
                break
            residual[token] = 0
        else:
            sampled = int(torch.multinomial(residual, 1, generator=generator))
            return path, [tree.token(a) for a in path] + [sampled]
        path.append(child)
        node = child
