"""Accepting draft tokens against the target distribution, losslessly, along a draft tree.

Drafts are deterministic (the MTP layer's top tokens), so each child's draft distribution is
one-hot. At a node with target distribution p and children c1, c2, ... (distinct tokens), the
multi-candidate rejection rule of SpecInfer accepts c1 with probability p(c1); on rejection p loses
c1 and is renormalized, and c2 is tried against that residual, and so on; when every child is
rejected the token is sampled from the final residual. Each token x then comes out with
probability exactly p(x), and an accepted child repeats the rule one level down with its own
target row. A chain is the tree of one child per node (plain speculative sampling); greedy rows
have a one-hot p, which makes this "follow the child that equals the target's argmax".

Sampled requests are judged on the device, many at once (judge_trees; judge_chains for a batch
of chains, without a loop), with each request's randomness drawn up front (draw_for_judging), so
the host reads the verdicts once and a seeded request draws the same numbers whichever judge
takes it. Greedy requests follow the argmax on the host (accept_greedy) or on the device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dsa_backend.spec.tree import DraftTree
from dsa_backend.transfer import HostCopy, to_device


def accept_greedy(argmax: Sequence[int], tree: DraftTree) -> tuple[list[int], list[int]]:
    """The rule for a greedy request, from each node's target argmax already on the host.

    A greedy target row is one-hot at its argmax, so the rule follows the child holding that token
    (child tokens are distinct) and emits the argmax where none does: the verdict judge_trees
    gives on one-hot rows, without sending anything to the device.
    """
    node, path = 0, []
    while True:
        child = next((c for c in tree.children[node] if tree.token(c) == argmax[node]), None)
        if child is None:
            return path, [tree.token(a) for a in path] + [argmax[node]]
        path.append(child)
        node = child


def draw_for_judging(requests: int, tries: tuple[int, ...], vocab: int, generators: Sequence[torch.Generator | None],
                     default: torch.Generator | None, device: torch.device,
                     own_tries: Sequence[tuple[int, ...]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The randomness a judge takes: for each request uniforms of shape `tries` (one a draft that
    may be tried), then `vocab` exponentials, from its own generator where it has one (a seeded
    request), else from `default`. A seeded request draws only the uniforms of its own tree's
    shape (own_tries[i]; `tries` when not given), at the front of its slab, so its numbers do not
    depend on the rest of the batch: a chain of k drafts draws k uniforms, and a request without
    drafts none, whichever judge takes it and whatever trees it is judged beside."""
    uniforms = torch.empty(requests, *tries, device=device)
    races = torch.empty(requests, vocab, device=device)
    if any(g is None for g in generators):
        uniforms.uniform_(generator=default)
        races.exponential_(generator=default)
    for i, generator in enumerate(generators):
        if generator is not None:
            shape = own_tries[i] if own_tries is not None else tries
            uniforms[i][tuple(slice(0, n) for n in shape)] = torch.empty(shape, device=device).uniform_(
                generator=generator)
            races[i].exponential_(generator=generator)
    return uniforms, races


def judge_chains(probs: torch.Tensor, drafts: torch.Tensor, uniforms: torch.Tensor,
                 races: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """judge_trees for R chains at once, without a loop: probs [R, n, vocab]: the target
    distribution after the root and after each draft; drafts [R, n - 1]; uniforms [R, n - 1] and
    races [R, vocab] from draw_for_judging -> (accepted [R]: drafts kept; tokens [R, n], whose
    first accepted + 1 are emitted: the kept drafts, then one token from the target).

    Draft j is kept when uniforms[:, j] times its row's mass falls below its probability under
    row j, as long as every draft before it was kept. The token after the kept drafts comes from
    the row there, less the draft it turned down (the residual; the whole row when every draft was
    kept), by an exponential race: argmax of p / q with q ~ Exp(1) picks token t with probability
    p(t) / sum(p), so the residual needs no renormalizing. Same draws, same verdicts as
    judge_trees on the chain."""
    last_draft = drafts.shape[1] - 1
    rows = probs[:, :-1]
    kept = uniforms * rows.sum(dim=2) < rows.gather(2, drafts.unsqueeze(2)).squeeze(2)
    accepted = kept.int().cumprod(dim=1).sum(dim=1)
    row = probs[torch.arange(probs.shape[0], device=probs.device), accepted]
    turned_down = drafts.gather(1, accepted.clamp(max=last_draft).unsqueeze(1))
    residual = row.scatter(1, turned_down, torch.where((accepted <= last_draft).unsqueeze(1), 0.0,
                                                        row.gather(1, turned_down)))
    token = (residual / races.clamp_min(torch.finfo(races.dtype).tiny)).argmax(dim=1, keepdim=True)
    tokens = torch.cat([drafts, token], dim=1).scatter(1, accepted.unsqueeze(1), token)
    return accepted, tokens


def judge_trees(probs: torch.Tensor, children: torch.Tensor, node_tokens: torch.Tensor, uniforms: torch.Tensor,
                races: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule above for R trees on the device, nothing read back. probs [R, N, vocab]: the target
    distribution after each node (rows past a tree's nodes are never read); children [R, N, C]:
    each node's children in order, -1 past them; node_tokens [R, N]; uniforms [R, D, C] (D: the
    most drafts on a path) and races [R, vocab] from draw_for_judging -> (path [R, D]: the
    accepted nodes from the root down, -1 past them; token [R]: the one drawn after them, by an
    exponential race over the residual, as judge_chains draws it)."""
    requests, depth, width = uniforms.shape
    rows = torch.arange(requests, device=probs.device)
    node = torch.zeros(requests, dtype=torch.long, device=probs.device)
    walking = torch.ones(requests, dtype=torch.bool, device=probs.device)
    residual = probs[:, 0].clone()
    path = torch.full((requests, depth), -1, dtype=torch.long, device=probs.device)
    for d in range(depth):
        moved, reached = torch.zeros_like(walking), node
        for j in range(width):
            child = children[rows, node, j]
            token = node_tokens[rows, child.clamp_min(0)].unsqueeze(1)
            p = residual.gather(1, token).squeeze(1)
            trying = walking & ~moved & (child >= 0)
            take = trying & (uniforms[:, d, j] * residual.sum(dim=1) < p)
            residual.scatter_(1, token, torch.where(trying & ~take, 0.0, p).unsqueeze(1))
            reached = torch.where(take, child, reached)
            moved |= take
        walking &= moved
        node = reached
        path[:, d] = torch.where(moved, node, -1)
        residual = torch.where(moved.unsqueeze(1), probs[rows, node], residual)
    token = (residual / races.clamp_min(torch.finfo(races.dtype).tiny)).argmax(dim=1)
    return path, token


def judge_trees_now(probs: torch.Tensor, trees: Sequence[DraftTree], first_rows: Sequence[int],
                    generators: Sequence[torch.Generator | None],
                    default: torch.Generator | None) -> list[tuple[list[int], list[int]]]:
    """judge_trees for trees whose node rows start at first_rows in probs [rows, vocab], read back
    at once -> (accepted node ids, root excluded; emitted tokens: theirs, then the drawn one) each."""
    nodes = max(t.num_nodes for t in trees)
    # each tree's (most drafts on a path, most children of a node); the batch's is their largest
    shapes = [(max(len(path) - 1 for path in t.ancestors), max(map(len, t.children))) for t in trees]
    depth, width = max(d for d, _ in shapes), max(w for _, w in shapes)
    device = probs.device
    rows = [first + min(node, t.num_nodes - 1) for first, t in zip(first_rows, trees) for node in range(nodes)]
    children = [[list(kids) + [-1] * (width - len(kids)) for kids in t.children] + [[-1] * width] * (nodes - t.num_nodes)
                for t in trees]
    node_tokens = [[0, *t.tokens] + [0] * (nodes - t.num_nodes) for t in trees]
    draws = draw_for_judging(len(trees), (depth, width), probs.shape[1], generators, default, device,
                             own_tries=shapes)
    # every row in order (trees of one size, nothing else in the batch): no copy of [rows, vocab]
    picked = probs if rows == list(range(probs.shape[0])) else probs[to_device(torch.tensor(rows), device)]
    path, token = judge_trees(picked.view(len(trees), nodes, -1),
                              to_device(torch.tensor(children, dtype=torch.long), device).view(len(trees), nodes, width),
                              to_device(torch.tensor(node_tokens), device), *draws)
    host = HostCopy(path, token).wait()
    return [([a for a in p if a >= 0], [t.token(a) for a in p if a >= 0] + [drawn])
            for t, p, drawn in zip(trees, *host)]
