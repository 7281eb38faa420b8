"""CUDA graphs for decode steps: one captured forward per (batch bucket, context bucket).

Eagerly, a decode step is host-bound: every layer's DSA calls cost 0.2-0.6 ms of host time on the
device machine (docs/PERFORMANCE.md, "Host time a call") against microseconds of GPU work. A graph
replays the whole forward's launches at once. A capture fixes every shape, so:
- a batch of n requests runs in the graph of the smallest batch bucket >= n; the rows past n are
  padding: token 0 at position 0 of a page held for them (their KV writes land there), length 1;
- the launch shapes that follow the longest context (the indexer logits' width, the top-k's
  launch) are the context bucket's, the smallest >= the batch's longest context. Each row still
  reads only its own keys: the kernels take the lengths from the device.
Metadata lives in static buffers that a replay fills in place; nothing in the forward reads back
from the GPU (tests/test_engine_gpu.py checks that under torch's sync debug mode).

Graphs are captured on a bucket's first use. The DSA kernels need one eager call of each shape on
the capture stream first (the top-k's barrier counters and FlashMLA's schedule, kernels/dispatch.py),
so a capture runs the forward eagerly on that stream before recording it, which also compiles its
Triton kernels. The eager run and the replay write the same KV for the step's tokens.
"""

from __future__ import annotations

import logging
import time

import torch

from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.cache import KVCache, pages_needed
from dsa_backend.models.model import DsaForCausalLM, ForwardOutput

logger = logging.getLogger(__name__)

# Contexts below this share one bucket: past a row's own length the kernels' programs return at
# once, so a short context pays little for a wider launch.
MIN_CONTEXT_BUCKET = 1024


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8, up to max_batch (itself included): a batch pads by
    at most 7 rows, or doubles below 8."""
    buckets = {b for b in (1, 2, 4) if b < max_batch} | set(range(8, max_batch, 8)) | {max_batch}
    return sorted(buckets)


def context_buckets(max_context: int) -> list[int]:
    """Powers of two from MIN_CONTEXT_BUCKET below max_context, then max_context: a launch is at
    most twice the longest context it serves."""
    buckets, c = {max_context}, MIN_CONTEXT_BUCKET
    while c < max_context:
        buckets.add(c)
        c *= 2
    return sorted(buckets)


def _bucket(buckets: list[int], n: int) -> int:
    return next(b for b in buckets if b >= n)


class DecodeGraphs:
    """Captured DECODE forwards of `model` over `cache`, replayed for batches of up to max_batch
    requests whose contexts reach at most max_context tokens. pad_page: a page of the cache held
    for padding rows, which nothing else may use."""

    def __init__(self, model: DsaForCausalLM, cache: KVCache, max_batch: int, max_context: int, pad_page: int):
        self.model, self.cache = model, cache
        self.batch_buckets = batch_buckets(max_batch)
        self.context_buckets = context_buckets(max_context)
        self.page_size = cache.page_size
        self.pad_page = pad_page
        device = cache.mla.buffer.device
        rows, long = self.batch_buckets[-1], dict(dtype=torch.long, device=device)
        self.input_ids = torch.zeros(rows, **long)
        self.positions = torch.zeros(rows, **long)
        self.out_cache_loc = torch.full((rows,), pad_page * self.page_size, **long)
        self.seq_lens = torch.ones(rows, dtype=torch.int32, device=device)
        self.extend_lens = torch.ones(rows, dtype=torch.int32, device=device)
        self.block_table = torch.full((rows, pages_needed(max_context, self.page_size)), pad_page,
                                      dtype=torch.int32, device=device)
        self.logits_rows = torch.arange(rows, device=device)
        # Every graph writes its outputs here, so that what a graph makes on the way, its logits
        # included, is pool memory the next capture reuses (one graph replays at a time): a
        # graph's own [rows, vocab] fp32 logits, kept for each of ~100 buckets, would hold GBs.
        c = model.config
        self.out = ForwardOutput(logits=torch.zeros(rows, c.vocab_size, device=device),
                                 hidden=torch.zeros(rows, c.hidden_size, dtype=model.model.embed_tokens.weight.dtype,
                                                    device=device),
                                 topk=torch.zeros(rows, c.index_topk, dtype=torch.int32, device=device))
        self.stream = torch.cuda.Stream(device)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def serves(self, batch: ForwardBatch) -> bool:
        """A plain decode batch within the buckets (no draft trees: those take the eager path)."""
        return (batch.mode is ForwardMode.DECODE and batch.tree is None
                and batch.batch_size <= self.batch_buckets[-1] and batch.max_seq_len <= self.context_buckets[-1])

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        """The model's forward of `batch` by graph replay. The outputs are views of the graph's
        static tensors: valid until the next replay."""
        n = batch.batch_size
        rows = _bucket(self.batch_buckets, n)
        context = _bucket(self.context_buckets, batch.max_seq_len)
        self._fill(batch, rows)
        key = (rows, context)
        if key not in self.graphs:
            self.graphs[key] = self._capture(rows, context)
        self.graphs[key].replay()
        return ForwardOutput(self.out.logits[:n], self.out.hidden[:n], self.out.topk[:n])

    def _fill(self, batch: ForwardBatch, rows: int) -> None:
        """Copy the batch into the static buffers and make rows past it padding."""
        n, width = batch.batch_size, batch.block_table.shape[1]
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        self.out_cache_loc[:n].copy_(batch.out_cache_loc)
        self.seq_lens[:n].copy_(batch.seq_lens)
        self.block_table[:n, :width].copy_(batch.block_table)
        self._pad(n, rows)

    def _pad(self, first: int, rows: int) -> None:
        """Rows [first, rows) become padding. A padding row's length is 1: of its table row it
        reads column 0 only."""
        if rows > first:
            self.input_ids[first:rows] = 0
            self.positions[first:rows] = 0
            self.out_cache_loc[first:rows] = self.pad_page * self.page_size
            self.seq_lens[first:rows] = 1
            self.block_table[first:rows, 0] = self.pad_page

    def _static_batch(self, rows: int, context: int) -> ForwardBatch:
        # The host lengths are the bucket's: they set the launch shapes, which must hold for every
        # batch the graph replays.
        return ForwardBatch(mode=ForwardMode.DECODE, input_ids=self.input_ids[:rows], positions=self.positions[:rows],
                            out_cache_loc=self.out_cache_loc[:rows], seq_lens=self.seq_lens[:rows],
                            extend_lens=self.extend_lens[:rows], seq_lens_cpu=[context] * rows,
                            extend_lens_cpu=[1] * rows, block_table=self.block_table[:rows],
                            page_size=self.page_size, logits_rows=self.logits_rows[:rows])

    def _capture(self, rows: int, context: int) -> torch.cuda.CUDAGraph:
        start = time.perf_counter()
        batch = self._static_batch(rows, context)
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            self.model(batch, self.cache)  # eager first, on the capture stream (module docstring)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            out = self.model(batch, self.cache)
            for static, made in zip((self.out.logits, self.out.hidden, self.out.topk), (out.logits, out.hidden, out.topk)):
                static[:rows].copy_(made)
        torch.cuda.current_stream().wait_stream(self.stream)
        logger.info("captured a decode graph for %d rows, contexts up to %d, in %.2f s (%d graphs)",
                    rows, context, time.perf_counter() - start, len(self.graphs) + 1)
        return graph

    def capture_all(self) -> None:
        """Capture every bucket now (start-up), largest first, so that serving captures none."""
        for rows in reversed(self.batch_buckets):
            for context in reversed(self.context_buckets):
                if (rows, context) not in self.graphs:
                    self._pad(0, rows)  # so that the capture's eager run writes the held page only
                    self.graphs[(rows, context)] = self._capture(rows, context)
