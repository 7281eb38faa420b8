"""Chain drafting (speculative_eagle_topk 1) as GPU work alone, so that one CUDA graph replays it.

DRAFT_EXTEND runs the MTP layer over each request's verified span; its root row's argmax is the
first draft. Each further step feeds the last draft at the next position, with the MTP layer's
own hidden state and top-k of the row before. A step's positions and slots follow from the roots'
on the device. The next verify takes the drafts on the device too, and the host reads them once,
after launching it (spec/drafter.ChainDrafts). A replay pads every request's span
to num_steps + 1 tokens (the most a verify accepts plus its root): the padding rows write KV at
positions past the span, which the draft steps and the next DRAFT_EXTEND rewrite before any row
reads them as history, or in the held page where the request has no page there.
"""

from __future__ import annotations

import torch

from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.cache import KVCache, pages_needed
from dsa_backend.cuda_graphs import BucketedGraphs, StaticBatch
from dsa_backend.models import DsaForCausalLM


def draft_chain(model: DsaForCausalLM, cache: KVCache, batch: ForwardBatch, hidden: torch.Tensor,
                topk: torch.Tensor | None, num_steps: int, context: int) -> torch.Tensor:
    """Drafts [requests, num_steps] int64 of a DRAFT_EXTEND batch whose logits_rows are its
    requests' roots, from the target's hidden [tokens, hidden] and top-k [tokens, index_topk]
    (None: the MTP layer's own indexer) at its rows. Every request's table must cover its root +
    num_steps - 1; context: the longest context of any step (the launch width)."""
    out = model.forward_mtp(batch, cache, hidden, topk)
    rows, page = batch.logits_rows, batch.page_size
    drafts = [out.logits.argmax(dim=-1)]
    hidden, topk = out.hidden[rows], None if topk is None else out.topk[rows]
    roots, requests = batch.positions[rows], rows.shape[0]
    ones = torch.ones(requests, dtype=torch.int32, device=rows.device)
    for step in range(1, num_steps):
        positions = roots + step
        pages = batch.block_table.gather(1, (positions // page)[:, None]).squeeze(1).long()
        step_batch = ForwardBatch(ForwardMode.DECODE, input_ids=drafts[-1], positions=positions,
                                  out_cache_loc=pages * page + positions % page, seq_lens=(positions + 1).int(),
                                  extend_lens=ones, seq_lens_cpu=[context] * requests, extend_lens_cpu=[1] * requests,
                                  block_table=batch.block_table, page_size=page,
                                  logits_rows=torch.arange(requests, device=rows.device))
        out = model.forward_mtp(step_batch, cache, hidden, topk)
        drafts.append(out.logits.argmax(dim=-1))
        hidden, topk = out.hidden, None if topk is None else out.topk
    return torch.stack(drafts, dim=1)


def chain_reach(span: int, num_steps: int, padded_to: int | None) -> int:
    """Positions from a request's start that its chain draft writes: the span (or its padding),
    and the steps past the root."""
    return max(padded_to or span, span + num_steps - 1)


def held_page_tables(page_tables: list[list[int]], ends: list[int], page_size: int, held_page: int) -> list[list[int]]:
    """Each table extended with the held page up to the pages of its end position: a chain's draft
    steps and padding rows may reach past a request's own pages (when it reserved none for drafts)."""
    return [pages + [held_page] * max(0, pages_needed(end, page_size) - len(pages))
            for pages, end in zip(page_tables, ends)]


class ChainDraftGraphs(BucketedGraphs):
    """Captured draft_chain calls over batches of up to max_batch requests, each span padded to
    num_steps + 1 tokens, contexts up to max_context."""

    def __init__(self, model: DsaForCausalLM, cache: KVCache, num_steps: int, reuses_topk: bool, max_batch: int,
                 max_context: int, pad_page: int):
        n, page, device = num_steps + 1, cache.page_size, cache.mla.buffer.device
        # the table reaches past the context by a span and the steps after it
        width = pages_needed(max_context + chain_reach(n, num_steps, n), page)
        super().__init__(StaticBatch(ForwardMode.DRAFT_EXTEND, max_batch, n, 1, width, pad_page, page, device),
                         max_context, self._draft_to_static)
        self.model, self.cache, self.num_steps = model, cache, num_steps
        self.backend = model.backend
        c, tokens = model.config, max_batch * n
        self.hidden = torch.zeros(tokens, c.hidden_size, dtype=model.model.embed_tokens.weight.dtype, device=device)
        self.topk = torch.zeros(tokens, c.index_topk, dtype=torch.int32, device=device) if reuses_topk else None
        self.drafts = torch.zeros(max_batch, num_steps, dtype=torch.long, device=device)

    def serves(self, batch: ForwardBatch, context: int) -> bool:
        """A padded DRAFT_EXTEND batch within the buckets, for the captured backend."""
        return self.model.backend is self.backend and self.fits(batch, context)

    def draft(self, batch: ForwardBatch, hidden: torch.Tensor, topk: torch.Tensor | None, context: int) -> torch.Tensor:
        """draft_chain by graph replay: a view of static drafts [requests, num_steps], valid until
        the next replay."""
        self.hidden[: batch.num_tokens].copy_(hidden)
        if self.topk is not None:
            self.topk[: batch.num_tokens].copy_(topk)
        self.replay(batch, context)
        return self.drafts[: batch.batch_size]

    def _draft_to_static(self, batch: ForwardBatch) -> None:
        t, context = batch.num_tokens, batch.max_seq_len
        topk = None if self.topk is None else self.topk[:t]
        drafts = draft_chain(self.model, self.cache, batch, self.hidden[:t], topk, self.num_steps, context)
        self.drafts[: batch.batch_size].copy_(drafts)
