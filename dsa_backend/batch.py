"""ForwardBatch: what one model forward computes, for a batch of requests of different lengths."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass

import torch

from dsa_backend.transfer import fields_to_device, to_device


class ForwardMode(enum.Enum):
    EXTEND = enum.auto()          # prefill, or a chunk of it: several new tokens per request
    DECODE = enum.auto()          # one new token per request (per frontier node in a tree draft step)
    TARGET_VERIFY = enum.auto()   # speculative decoding: draft tokens checked by the target
    DRAFT_EXTEND = enum.auto()    # speculative decoding: the draft layer catches up on accepted tokens

    @property
    def is_extend_like(self) -> bool:
        """Modes that take the ragged (per-sequence offsets) indexer path."""
        return self is ForwardMode.EXTEND


@dataclass(frozen=True)
class TreeLayout:
    """A request's new tokens as nodes of a draft tree whose root (node 0) sits at the request's
    prefix length `base`: ancestors[j] = node ids from the root down to token j's own node.

    Token j's KV goes to position base + node (each node its own slot), its RoPE position is
    base + depth (siblings share it), and it sees positions < base plus its ancestors' slots.
    """

    ancestors: tuple[tuple[int, ...], ...]

    @property
    def is_causal(self) -> bool:
        """Node ids equal to depths along one path: plain position causality gives the same."""
        return all(a == tuple(range(len(a))) for a in self.ancestors)


@dataclass(frozen=True)
class TreeVisibility:
    """What each query token sees when a batch holds draft trees: its request's positions
    < base[t], plus base[t] + ancestors[t] (node ids, root to itself, -1 padded).

    A token outside a tree is node 0 of a tree based at its own position, which is plain causality.
    Either way a token sees positions[t] + 1 keys. base: [tokens] int64; ancestors: [tokens, depth + 1].
    """

    base: torch.Tensor
    ancestors: torch.Tensor

    def visible_positions(self, rows: slice, width: int) -> torch.Tensor:
        """[rows, width] int64: the KV position of each row's j-th visible key, ascending (past a
        row's own count the entries are filler positions of the same request)."""
        base = self.base[rows, None]
        ancestors = self.ancestors[rows]
        j = torch.arange(width, device=base.device)[None, :]
        depth = (j - base).clamp(0, ancestors.shape[1] - 1)
        nodes = ancestors.gather(1, depth).clamp_min(0)
        return torch.where(j < base, j, base + nodes)


@dataclass  # not frozen: a CUDA-graph replay rebinds its metadata (seed 003: a frozen one hung SGLang)
class ForwardBatch:
    """Tokens of all requests, flattened request after request.

    input_ids, positions, out_cache_loc: [tokens]; seq_lens, extend_lens: [batch] (KV length after
    this forward, and tokens added by it); seq_lens_cpu, extend_lens_cpu: the same on the host, so
    that the layers' launch shapes (the longest context, the pieces of an EXTEND step) need no read
    back from the GPU, which would wait for it (whoever rebinds seq_lens or extend_lens rebinds
    these); block_table: [batch, max_pages] int32 page ids; logits_rows: [rows] token rows whose
    logits are returned (last token of each request unless the mode wants every token); tree:
    per-token visibility when some request's tokens form a draft tree (None: position causality).
    """

    mode: ForwardMode
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: torch.Tensor
    extend_lens: torch.Tensor
    seq_lens_cpu: list[int]
    extend_lens_cpu: list[int]
    block_table: torch.Tensor
    page_size: int
    logits_rows: torch.Tensor
    tree: TreeVisibility | None = None

    @property
    def batch_size(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_cpu)

    @property
    def token_offsets(self) -> list[int]:
        """Start row of each request's tokens, plus the total: [batch + 1] (host ints)."""
        return list(itertools.accumulate(self.extend_lens_cpu, initial=0))

    def slots(self, request: int, positions: torch.Tensor) -> torch.Tensor:
        """Pool slot ids of a request's token positions, through its block table row."""
        pages = self.block_table[request].long()[positions // self.page_size]
        return pages * self.page_size + positions % self.page_size

    @classmethod
    def build(cls, mode: ForwardMode, input_ids: list[list[int]], prefix_lens: list[int],
              page_tables: list[list[int]], page_size: int, device: torch.device | str = "cpu",
              all_logits: bool | list[bool] = False,
              trees: list[TreeLayout | None] | None = None) -> "ForwardBatch":
        """From per-request new token ids, cached-prefix lengths and page lists.

        all_logits (one flag, or one per request): return logits for every new token of the
        request (speculative verify) rather than only its last. trees[r], when given, lays request
        r's tokens out as draft-tree nodes based at prefix_lens[r] (see TreeLayout).
        """
        device = torch.device(device)
        extend = [len(ids) for ids in input_ids]
        if any(n == 0 for n in extend):
            raise ValueError("every request in a forward batch needs at least one new token")
        trees = trees or [None] * len(extend)
        positions, cache_positions, bases, ancestors = [], [], [], []
        for prefix, n, tree in zip(prefix_lens, extend, trees):
            if tree is None:
                plain = list(range(prefix, prefix + n))
                positions += plain
                cache_positions += plain
                bases += plain
                ancestors += [(0,)] * n
            else:
                if len(tree.ancestors) != n:
                    raise ValueError(f"a tree layout of {len(tree.ancestors)} nodes for {n} tokens")
                positions += [prefix + len(a) - 1 for a in tree.ancestors]
                cache_positions += [prefix + a[-1] for a in tree.ancestors]
                bases += [prefix] * n
                ancestors += list(tree.ancestors)
        # Plain lists, made tensors at the end: every step builds a batch, and with a small tensor
        # or two a request, the build took 0.75 ms of a 6.6 ms graphed decode step at 32 requests
        # (H100 machine, docs/PERFORMANCE.md, "CUDA graphs for decode steps").
        ends = list(itertools.accumulate(extend))
        seq = [max(cache_positions[e - n: e]) + 1 for e, n in zip(ends, extend)]
        for r, (length, pages) in enumerate(zip(seq, page_tables)):
            if len(pages) * page_size < length:
                raise ValueError(f"request {r} needs {length} KV slots but has {len(pages)} pages of {page_size}")
        slots = [pages[pos // page_size] * page_size + pos % page_size
                 for pages, e, n in zip(page_tables, ends, extend) for pos in cache_positions[e - n: e]]
        width = max(len(p) for p in page_tables)
        flags = all_logits if isinstance(all_logits, list) else [all_logits] * len(extend)
        rows = [i for e, n, every in zip(ends, extend, flags) for i in (range(e - n, e) if every else (e - 1,))]
        tree = None
        if any(t is not None and not t.is_causal for t in trees):
            depth = max(len(a) for a in ancestors)
            padded = torch.tensor([list(a) + [-1] * (depth - len(a)) for a in ancestors])
            tree = TreeVisibility(to_device(torch.tensor(bases), device), to_device(padded, device))
        # Two host-to-device copies, one a dtype, each field a view of one: a copy costs more
        # host time than the Python that fills it. Neither waits for the GPU (transfer.py).
        longs = fields_to_device([[t for ids in input_ids for t in ids], positions, slots, rows], torch.long, device)
        table = [page for pages in page_tables for page in pages + [0] * (width - len(pages))]
        ints = fields_to_device([seq, extend, table], torch.int32, device)
        return cls(mode=mode, input_ids=longs[0], positions=longs[1], out_cache_loc=longs[2], seq_lens=ints[0],
                   extend_lens=ints[1], seq_lens_cpu=seq, extend_lens_cpu=extend,
                   block_table=ints[2].view(len(seq), width), page_size=page_size, logits_rows=longs[3], tree=tree)
