"""ForwardBatch: what one model forward computes, for a batch of requests of different lengths."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class ForwardMode(enum.Enum):
    EXTEND = enum.auto()          # prefill, or a chunk of it: several new tokens per request
    DECODE = enum.auto()          # one new token per request
    TARGET_VERIFY = enum.auto()   # speculative decoding: draft tokens checked by the target
    DRAFT_EXTEND = enum.auto()    # speculative decoding: the draft layer catches up on accepted tokens

    @property
    def is_extend_like(self) -> bool:
        """Modes that take the ragged (per-sequence offsets) indexer path."""
        return self is ForwardMode.EXTEND


@dataclass(frozen=True)
class ForwardBatch:
    """Tokens of all requests, flattened request after request.

    input_ids, positions, out_cache_loc: [tokens]; seq_lens, extend_lens: [batch] (KV length after
    this forward, and tokens added by it); block_table: [batch, max_pages] int32 page ids;
    logits_rows: [rows] token rows whose logits are returned (last token of each request unless
    the mode wants every token).
    """

    mode: ForwardMode
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: torch.Tensor
    extend_lens: torch.Tensor
    block_table: torch.Tensor
    page_size: int
    logits_rows: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def token_offsets(self) -> list[int]:
        """Start row of each request's tokens, plus the total: [batch + 1] (host ints)."""
        return [0] + torch.cumsum(self.extend_lens, 0).tolist()

    def slots(self, request: int, positions: torch.Tensor) -> torch.Tensor:
        """Pool slot ids of a request's token positions, through its block table row."""
        pages = self.block_table[request].long()[positions // self.page_size]
        return pages * self.page_size + positions % self.page_size

    @classmethod
    def build(cls, mode: ForwardMode, input_ids: list[list[int]], prefix_lens: list[int],
              page_tables: list[list[int]], page_size: int, device: torch.device | str = "cpu",
              all_logits: bool | list[bool] = False) -> "ForwardBatch":
        """From per-request new token ids, cached-prefix lengths and page lists.

        all_logits (one flag, or one per request): return logits for every new token of the
        request (speculative verify) rather than only its last.
        """
        extend = [len(ids) for ids in input_ids]
        if any(n == 0 for n in extend):
            raise ValueError("every request in a forward batch needs at least one new token")
        seq = [p + n for p, n in zip(prefix_lens, extend)]
        for r, (length, pages) in enumerate(zip(seq, page_tables)):
            if len(pages) * page_size < length:
                raise ValueError(f"request {r} needs {length} KV slots but has {len(pages)} pages of {page_size}")
        width = max(len(p) for p in page_tables)
        table = torch.zeros(len(page_tables), width, dtype=torch.int32)
        for r, pages in enumerate(page_tables):
            table[r, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        positions = torch.cat([torch.arange(p, p + n) for p, n in zip(prefix_lens, extend)])
        request_of_token = torch.repeat_interleave(torch.arange(len(extend)), torch.tensor(extend))
        pages_of_token = table.long()[request_of_token, positions // page_size]
        ends = torch.cumsum(torch.tensor(extend), 0)
        flags = all_logits if isinstance(all_logits, list) else [all_logits] * len(extend)
        rows = torch.cat([torch.arange(int(e) - n, int(e)) if every else torch.tensor([int(e) - 1])
                          for e, n, every in zip(ends, extend, flags)])
        return cls(
            mode=mode,
            input_ids=torch.tensor([t for ids in input_ids for t in ids], dtype=torch.long, device=device),
            positions=positions.to(device),
            out_cache_loc=(pages_of_token * page_size + positions % page_size).to(device),
            seq_lens=torch.tensor(seq, dtype=torch.int32, device=device),
            extend_lens=torch.tensor(extend, dtype=torch.int32, device=device),
            block_table=table.to(device),
            page_size=page_size,
            logits_rows=rows.to(device),
        )
