"""MTP drafting: catch the draft layer up on verified tokens, then grow a draft tree num_steps deep.

DRAFT_EXTEND runs the MTP layer over the positions the target just verified (or prefilled): at
position i it sees the target's hidden state h_i and the token at i + 1, writing its own KV. Its
last row (at position base, the tree's root) gives the first level: the topk most likely tokens.
Each further step feeds the frontier (the topk best nodes of the last level by cumulative draft
log-probability) with the MTP layer's own hidden state of its parent's row (EAGLE-style), one
position deeper; every fed node gets its own KV slot, base + its MTP node id, and sees the prefix
plus its ancestors (a TreeLayout). With topk 1 this is a plain chain in plain positions, drafted
on the GPU alone (spec/chain.py). Every MTP KV row a draft step writes is rewritten by a later
DRAFT_EXTEND before it is read as history.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from dsa_backend.batch import ForwardBatch, ForwardMode, TreeLayout
from dsa_backend.cache import KVCache
from dsa_backend.models import DsaForCausalLM, ForwardOutput
from dsa_backend.sequence import Sequence
from dsa_backend.spec.chain import ChainDraftGraphs, chain_reach, draft_chain, held_page_tables
from dsa_backend.spec.config import SpecConfig
from dsa_backend.spec.tree import DraftTree, best_first_tree
from dsa_backend.transfer import HostCopy


@dataclass(frozen=True)
class DraftInput:
    """One request's verified span: MTP positions start.., the tokens one position ahead, and the
    target output's rows at those positions (its hidden and, for a chain, its last layer's top-k)."""

    seq: Sequence
    start: int
    tokens: list[int]
    rows: list[int]
    wants_drafts: bool


@dataclass(frozen=True)
class ChainDrafts:
    """A chain draft step's tokens: on the GPU, where the next verify step takes its inputs, and on
    their way to the host, which needs them only to judge that step (so nothing waits for them
    before the verify is launched). Each of `seqs` holds a DraftTree naming them (DraftTree.unread)."""

    token_ids: torch.Tensor                 # [requests * num_steps]: request i's step j at i * num_steps + j
    host: HostCopy
    num_steps: int
    seqs: list[Sequence] = field(default_factory=list)

    def hand_to(self, seq: Sequence, request: int) -> None:
        """Give seq the drafts of the drafting batch's request `request`, unread."""
        seq.draft = DraftTree.chain([-1 - (request * self.num_steps + j) for j in range(self.num_steps)])
        self.seqs.append(seq)

    def read(self) -> None:
        """Give each request its drafts' token ids (waits for the draft step, not for the verify after it)."""
        (tokens,) = self.host.wait()
        for seq in self.seqs:
            if seq.draft is not None and seq.draft.unread:
                seq.draft = DraftTree.chain([tokens[-1 - t] for t in seq.draft.tokens])


class MtpDrafter:
    """Drafts for the engine's requests. held_page: a page for a chain's writes past a request's
    own pages; graphs: captured chain drafts (None: eager)."""

    def __init__(self, model: DsaForCausalLM, cache: KVCache, spec: SpecConfig, page_size: int,
                 device: torch.device, held_page: int | None = None, graphs: ChainDraftGraphs | None = None):
        self.model, self.cache, self.spec = model, cache, spec
        self.page_size, self.device = page_size, device
        self.held_page, self.graphs = held_page, graphs

    def draft(self, items: list[DraftInput], target: ForwardOutput) -> ChainDrafts | None:
        """Run DRAFT_EXTEND for every item over the target output's rows; set seq.draft of those
        that want drafts. A chain's drafts come back unread (ChainDrafts)."""
        if not items:
            return None
        if self.spec.is_chain:
            return self._draft_chain(items, target)
        batch = ForwardBatch.build(ForwardMode.DRAFT_EXTEND, [it.tokens for it in items],
                                   [it.start for it in items], [it.seq.pages for it in items],
                                   self.page_size, self.device)
        rows = torch.tensor([r for it in items for r in it.rows], device=self.device)
        out = self.model.forward_mtp(batch, self.cache, target.hidden[rows])
        wanted = [i for i, it in enumerate(items) if it.wants_drafts]
        if not wanted:
            return None
        last_rows = batch.logits_rows[wanted]
        seqs = [items[i].seq for i in wanted]
        roots = [items[i].start + len(items[i].tokens) - 1 for i in wanted]
        trees = self._grow(seqs, roots, out.logits[wanted], out.hidden[last_rows], out.topk[last_rows])
        for seq, tree in zip(seqs, trees):
            seq.draft = tree
        return None

    def _draft_chain(self, items: list[DraftInput], target: ForwardOutput) -> ChainDrafts | None:
        """Every request drafts (draft_chain); those that want them keep theirs. For a graph replay
        each span is padded to num_steps + 1 rows (token 0, the span's last target row)."""
        steps, n = self.spec.num_steps, self.spec.num_steps + 1
        padded = n if self.graphs is not None and all(len(it.tokens) <= n for it in items) else None
        pad = [(padded or 0) - len(it.tokens) for it in items]
        rows = torch.tensor([r for it, p in zip(items, pad) for r in it.rows + it.rows[-1:] * p], device=self.device)
        ends = [it.start + chain_reach(len(it.tokens), steps, padded) for it in items]
        tables = held_page_tables([it.seq.pages for it in items], ends, self.page_size, self.held_page)
        batch = ForwardBatch.build(ForwardMode.DRAFT_EXTEND, [it.tokens + [0] * p for it, p in zip(items, pad)],
                                   [it.start for it in items], tables, self.page_size, self.device)
        firsts = itertools.accumulate(batch.extend_lens_cpu, initial=0)
        batch.logits_rows = torch.tensor([first + len(it.tokens) - 1 for first, it in zip(firsts, items)],
                                         device=self.device)
        hidden, topk = target.hidden[rows], target.topk[rows] if self.spec.reuses_topk else None
        if not any(it.wants_drafts for it in items):  # chunks of prompts: the MTP layer's KV only
            self.model.forward_mtp(batch, self.cache, hidden, topk)
            return None
        drafts = self._run_chain(batch, hidden, topk, max(ends), padded is not None)
        for i, it in enumerate(items):
            if it.wants_drafts:
                drafts.hand_to(it.seq, i)
        return drafts

    def draft_verified_chains(self, seqs: list[Sequence], starts: list[int], target: ForwardOutput,
                              tokens: torch.Tensor, accepted: torch.Tensor) -> ChainDrafts:
        """Drafts after a verify of chains whose acceptance stayed on the GPU, for the caller to
        hand out (ChainDrafts.hand_to). Request i's span is its verify span, num_steps + 1 rows
        from starts[i], fed the verify's tokens [requests * (num_steps + 1)] (the target's choice
        after each node: the accepted drafts, then the next token, then padding), its root
        accepted[i] rows in. Every shape is known on the host, so nothing waits for the verify."""
        steps, n = self.spec.num_steps, self.spec.num_steps + 1
        ends = [start + chain_reach(n, steps, n) for start in starts]   # the most any acceptance reaches
        tables = held_page_tables([seq.pages for seq in seqs], ends, self.page_size, self.held_page)
        batch = ForwardBatch.build(ForwardMode.DRAFT_EXTEND, [[0] * n] * len(seqs), starts, tables,
                                   self.page_size, self.device)
        batch.input_ids = tokens
        batch.logits_rows = torch.arange(len(seqs), device=self.device) * n + accepted
        return self._run_chain(batch, target.hidden, target.topk if self.spec.reuses_topk else None, max(ends),
                               padded=True)

    def _run_chain(self, batch: ForwardBatch, hidden: torch.Tensor, topk: torch.Tensor | None, context: int,
                   padded: bool) -> ChainDrafts:
        """draft_chain by graph replay where a graph serves the (padded) batch, else eagerly."""
        if padded and self.graphs is not None and self.graphs.serves(batch, context):
            # a copy of the graph's buffer, which the next replay rewrites
            drafts = self.graphs.draft(batch, hidden, topk, context).flatten().clone()
        else:
            drafts = draft_chain(self.model, self.cache, batch, hidden, topk, self.spec.num_steps, context).flatten()
        return ChainDrafts(drafts, HostCopy(drafts), self.spec.num_steps)

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
