"""MTP drafting: catch the draft layer up on verified tokens, then grow a draft tree num_steps deep.

DRAFT_EXTEND runs the MTP layer over the positions the target just verified (or prefilled): at
position i it sees the target's hidden state h_i and the token at i + 1, writing its own KV. Its
last row (at position base, the tree's root) gives the first level: the topk most likely tokens.
Each further step feeds the frontier (the topk best nodes of the last level by cumulative draft
log-probability) with the MTP layer's own hidden state of its parent's row (EAGLE-style), one
position deeper; every fed node gets its own KV slot, base + its MTP node id, and sees the prefix
plus its ancestors (a TreeLayout). With topk 1 this is a plain chain in plain positions. Every
MTP KV row a draft step writes is rewritten by a later DRAFT_EXTEND before it is read as history.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsa_backend.batch import ForwardBatch, ForwardMode, TreeLayout
from dsa_backend.cache import KVCache
from dsa_backend.models import DsaForCausalLM
from dsa_backend.sequence import Sequence
from dsa_backend.spec.config import SpecConfig
from dsa_backend.spec.tree import DraftTree, best_first_tree


@dataclass(frozen=True)
class DraftInput:
    """One request's verified span: MTP positions start.., the tokens one position ahead, and
    the target's hidden [n, hidden] and last-layer top-k [n, index_topk] (None unless the MTP
    layer reuses it) at those positions."""

    seq: Sequence
    start: int
    tokens: list[int]
    hidden: torch.Tensor
    topk: torch.Tensor | None
    wants_drafts: bool


class MtpDrafter:
    def __init__(self, model: DsaForCausalLM, cache: KVCache, spec: SpecConfig, page_size: int,
                 device: torch.device):
        self.model, self.cache, self.spec = model, cache, spec
        self.page_size, self.device = page_size, device

    def draft(self, items: list[DraftInput]) -> None:
        """Run DRAFT_EXTEND for every item; set seq.draft of those that want drafts."""
        if not items:
            return
        batch = ForwardBatch.build(ForwardMode.DRAFT_EXTEND, [it.tokens for it in items],
                                   [it.start for it in items], [it.seq.pages for it in items],
                                   self.page_size, self.device)
        # Reusing the target's top-k is valid here: same positions, same causal history.
        topk = torch.cat([it.topk for it in items]) if self.spec.reuses_topk else None
        out = self.model.forward_mtp(batch, self.cache, torch.cat([it.hidden for it in items]), topk)
        wanted = [i for i, it in enumerate(items) if it.wants_drafts]
        if not wanted:
            return
        last_rows = batch.logits_rows[wanted]
        seqs = [items[i].seq for i in wanted]
        roots = [items[i].start + len(items[i].tokens) - 1 for i in wanted]
        trees = self._grow(seqs, roots, out.logits[wanted], out.hidden[last_rows], out.topk[last_rows])
        for seq, tree in zip(seqs, trees):
            seq.draft = tree

    def _grow(self, seqs: list[Sequence], roots: list[int], logits: torch.Tensor, hidden: torch.Tensor,
              topk: torch.Tensor) -> list[DraftTree]:
        """From the root rows' logits [W, vocab], hidden and top-k: num_steps levels of topk children
        per frontier node, then the num_draft_tokens - 1 best candidates of all levels."""
        k, width = self.spec.topk, len(seqs)
        scores, tokens = logits.log_softmax(dim=-1).topk(k, dim=-1)              # [W, k]: level 1
        # Candidates of every level in generation order, per request: token, score, parent candidate.
        cand_tokens, cand_scores = tokens.tolist(), scores.tolist()
        cand_parents = [[-1] * k for _ in range(width)]
        frontier = [list(range(k)) for _ in range(width)]    # candidate ids of the nodes fed next
        lineage = [[(0,)] * k for _ in range(width)]           # MTP node ids from the root to each one's parent
        hidden, topk = hidden.repeat_interleave(k, dim=0), topk.repeat_interleave(k, dim=0)
        for step in range(1, self.spec.num_steps):
            first_id = 1 + (step - 1) * k                     # MTP node ids of this step's frontier
            fed = [[lineage[w][j] + (first_id + j,) for j in range(k)] for w in range(width)]
            batch = ForwardBatch.build(
                ForwardMode.DECODE, [[cand_tokens[w][c] for c in frontier[w]] for w in range(width)], roots,
                [s.pages for s in seqs], self.page_size, self.device, all_logits=True,
                trees=[TreeLayout(tuple(f)) for f in fed])
            # A chain's rows each continue the previous step's row, so its top-k is a valid (older) selection.
            out = self.model.forward_mtp(batch, self.cache, hidden, topk if self.spec.reuses_topk else None)
            child_scores, child_tokens = out.logits.log_softmax(dim=-1).topk(k, dim=-1)   # [W * k, k]
            total = (scores.reshape(-1, 1) + child_scores).view(width, k * k)
            scores, best = total.topk(k, dim=-1)                                           # next frontier
            new_tokens, new_scores, best_list = child_tokens.view(width, k * k).tolist(), total.tolist(), best.tolist()
            for w in range(width):
                offset = len(cand_tokens[w])
                cand_tokens[w] += new_tokens[w]
                cand_scores[w] += new_scores[w]
                cand_parents[w] += [frontier[w][j // k] for j in range(k * k)]
                frontier[w] = [offset + b for b in best_list[w]]
                lineage[w] = [fed[w][b // k] for b in best_list[w]]
            rows = (torch.arange(width, device=best.device)[:, None] * k + best // k).view(-1)  # parents' rows
            hidden, topk = out.hidden[rows], out.topk[rows]
        size = self.spec.num_draft_tokens - 1
        return [best_first_tree(cand_tokens[w], cand_scores[w], cand_parents[w], size) for w in range(width)]
