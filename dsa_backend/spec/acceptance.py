"""Accepting draft tokens against the target distribution, losslessly, along a draft tree.

Drafts are deterministic (the MTP layer's top tokens), so each child's draft distribution is
one-hot. At a node with target distribution p and children c1, c2, ... (distinct tokens), the
multi-candidate rejection rule of SpecInfer accepts c1 with probability p(c1); on rejection p loses
c1 and is renormalized, and c2 is tried against that residual, and so on; when every child is
rejected the token is sampled from the final residual. Each token x then comes out with
probability exactly p(x), and an accepted child repeats the rule one level down with its own
target row. A chain is the tree of one child per node (plain speculative sampling); greedy rows
have a one-hot p, which makes this "follow the child that equals the target's argmax".

Chains are also judged on the device, many at once and with nothing read back (judge_chains):
the same rule, with each request's randomness drawn up front (draw_for_chains) so that a seeded
request draws the same numbers whichever way its step is judged.
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


def draw_for_chains(requests: int, steps: int, vocab: int, generators: Sequence[torch.Generator | None],
                    default: torch.Generator | None, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The randomness judge_chains takes: for each request `steps` uniforms, then `vocab`
    exponentials, from its own generator where it has one (a seeded request), else from `default`."""
    uniforms = torch.empty(requests, steps, device=device)
    races = torch.empty(requests, vocab, device=device)
    if any(g is None for g in generators):
        uniforms.uniform_(generator=default)
        races.exponential_(generator=default)
    for i, generator in enumerate(generators):
        if generator is not None:
            uniforms[i].uniform_(generator=generator)
            races[i].exponential_(generator=generator)
    return uniforms, races


def judge_chains(probs: torch.Tensor, drafts: torch.Tensor, uniforms: torch.Tensor,
                 races: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """accept_tree for R chains on the device. probs [R, n, vocab]: the target distribution after
    the root and after each draft; drafts [R, n - 1]; uniforms [R, n - 1] and races [R, vocab] from
    draw_for_chains -> (accepted [R]: drafts kept; tokens [R, n], whose first accepted + 1 are
    emitted: the kept drafts, then one token from the target).

    Draft j is kept when uniforms[:, j] falls below its probability under row j, as long as every
    draft before it was kept. The token after the kept drafts comes from the row there, less the
    draft it turned down (the residual; the whole row when every draft was kept), by an
    exponential race: argmax of p / q with q ~ Exp(1) picks token t with probability p(t) / sum(p),
    so the residual needs no renormalizing."""
    last_draft = drafts.shape[1] - 1
    kept = uniforms < probs[:, :-1].gather(2, drafts.unsqueeze(2)).squeeze(2)
    accepted = kept.int().cumprod(dim=1).sum(dim=1)
    row = probs[torch.arange(probs.shape[0], device=probs.device), accepted]
    turned_down = drafts.gather(1, accepted.clamp(max=last_draft).unsqueeze(1))
    residual = row.scatter(1, turned_down, torch.where((accepted <= last_draft).unsqueeze(1), 0.0,
                                                        row.gather(1, turned_down)))
    token = (residual / races.clamp_min(torch.finfo(races.dtype).tiny)).argmax(dim=1, keepdim=True)
    tokens = torch.cat([drafts, token], dim=1).scatter(1, accepted.unsqueeze(1), token)
    return accepted, tokens
