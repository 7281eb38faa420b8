"""CUDA graphs for decode steps (and a chain's verify): one captured forward per (batch bucket,
context bucket).

Eagerly, a decode step is host-bound: every layer's DSA calls cost 0.2-0.6 ms of host time on the
device machine (docs/PERFORMANCE.md, "Host time a call") against microseconds of GPU work. A graph
replays the whole forward's launches at once. A capture fixes every shape, so:
- a batch of b requests runs in the graph of the smallest batch bucket >= b; the requests past b
  are padding: token 0 at positions 0.. of a page held for them (their KV writes land there);
- the launch shapes that follow the longest context (the indexer logits' width, the top-k's
  launch) are the context bucket's, the smallest >= the batch's longest context. Each row still
  reads only its own keys: the kernels take the lengths from the device.
Metadata lives in static buffers that a replay fills in place; nothing in the forward reads back
from the GPU (tests/test_models.py checks that under torch's sync debug mode).

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
    """Captured decode-like forwards of `model` over `cache`: n = tokens_per_request new tokens a
    request, DECODE for 1, a chain's TARGET_VERIFY (root and drafts) for more. Replayed for
    batches of up to max_batch requests whose contexts reach at most max_context tokens.
    pad_page: a page of the cache held for padding requests, which nothing else may use."""

    def __init__(self, model: DsaForCausalLM, cache: KVCache, max_batch: int, max_context: int, pad_page: int,
                 tokens_per_request: int = 1):
        self.model, self.cache = model, cache
        # What the graphs replay is this backend's launches: a forward with another one set on the
        # model (a test or benchmark comparing backends) takes the eager path.
        self.backend = model.backend
        self.n = tokens_per_request
        self.mode = ForwardMode.DECODE if self.n == 1 else ForwardMode.TARGET_VERIFY
        self.batch_buckets = batch_buckets(max_batch)
        self.context_buckets = context_buckets(max_context)
        self.page_size = cache.page_size
        self.pad_page = pad_page
        device = cache.mla.buffer.device
        requests = self.batch_buckets[-1]
        tokens, long = requests * self.n, dict(dtype=torch.long, device=device)
        # A padding request's tokens sit at positions 0..n-1, every page of its table the held one.
        self.pad_positions = torch.arange(self.n, **long).repeat(requests)
        self.pad_slots = pad_page * self.page_size + self.pad_positions % self.page_size
        self.pad_pages = pages_needed(self.n, self.page_size)
        self.input_ids = torch.zeros(tokens, **long)
        self.positions = self.pad_positions.clone()
        self.out_cache_loc = self.pad_slots.clone()
        self.seq_lens = torch.full((requests,), self.n, dtype=torch.int32, device=device)
        self.extend_lens = torch.full((requests,), self.n, dtype=torch.int32, device=device)
        self.block_table = torch.full((requests, pages_needed(max_context, self.page_size)), pad_page,
                                      dtype=torch.int32, device=device)
        self.logits_rows = torch.arange(tokens, device=device)  # a verify scores every token
        # Every graph writes its outputs here, so that what a graph makes on the way, its logits
        # included, is pool memory the next capture reuses (one graph replays at a time): a
        # graph's own [tokens, vocab] fp32 logits, kept for each of ~100 buckets, would hold GBs.
        c = model.config
        self.out = ForwardOutput(logits=torch.zeros(tokens, c.vocab_size, device=device),
                                 hidden=torch.zeros(tokens, c.hidden_size, dtype=model.model.embed_tokens.weight.dtype,
                                                    device=device),
                                 topk=torch.zeros(tokens, c.index_topk, dtype=torch.int32, device=device))
        self.stream = self.pool = None  # made by the first capture (the rest also runs on the CPU, for tests)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def serves(self, batch: ForwardBatch) -> bool:
        """A batch of this mode with n tokens in every request, in position order (no draft
        trees: those take the eager path), within the buckets and the static block table (pages
        reserved for drafts may reach past the longest context), for the captured backend."""
        return (self.model.backend is self.backend and batch.mode is self.mode and batch.tree is None
                and set(batch.extend_lens_cpu) == {self.n} and batch.batch_size <= self.batch_buckets[-1]
                and batch.max_seq_len <= self.context_buckets[-1]
                and batch.block_table.shape[1] <= self.block_table.shape[1])

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        """The model's forward of `batch` by graph replay. The outputs are views of static
        tensors: valid until the next replay."""
        requests = _bucket(self.batch_buckets, batch.batch_size)
        context = _bucket(self.context_buckets, batch.max_seq_len)
        self._fill(batch, requests)
        key = (requests, context)
        if key not in self.graphs:
            self.graphs[key] = self._capture(requests, context)
        self.graphs[key].replay()
        t = batch.num_tokens
        return ForwardOutput(self.out.logits[:t], self.out.hidden[:t], self.out.topk[:t])

    def _fill(self, batch: ForwardBatch, requests: int) -> None:
        """Copy the batch into the static buffers and make the requests past it padding."""
        b, t, width = batch.batch_size, batch.num_tokens, batch.block_table.shape[1]
        self.input_ids[:t].copy_(batch.input_ids)
        self.positions[:t].copy_(batch.positions)
        self.out_cache_loc[:t].copy_(batch.out_cache_loc)
        self.seq_lens[:b].copy_(batch.seq_lens)
        self.block_table[:b, :width].copy_(batch.block_table)
        self._pad(b, requests)

    def _pad(self, first: int, requests: int) -> None:
        """Requests [first, requests) become padding: of its table row a padding request reads
        the first pad_pages columns only."""
        if requests > first:
            tokens = slice(first * self.n, requests * self.n)
            self.input_ids[tokens] = 0
            self.positions[tokens] = self.pad_positions[tokens]
            self.out_cache_loc[tokens] = self.pad_slots[tokens]
            self.seq_lens[first:requests] = self.n
            self.block_table[first:requests, : self.pad_pages] = self.pad_page

    def _static_batch(self, requests: int, context: int) -> ForwardBatch:
        # The host lengths are the bucket's: they set the launch shapes, which must hold for every
        # batch the graph replays.
        tokens = requests * self.n
        return ForwardBatch(mode=self.mode, input_ids=self.input_ids[:tokens], positions=self.positions[:tokens],
                            out_cache_loc=self.out_cache_loc[:tokens], seq_lens=self.seq_lens[:requests],
                            extend_lens=self.extend_lens[:requests], seq_lens_cpu=[context] * requests,
                            extend_lens_cpu=[self.n] * requests, block_table=self.block_table[:requests],
                            page_size=self.page_size, logits_rows=self.logits_rows[:tokens])

    def _capture(self, requests: int, context: int) -> torch.cuda.CUDAGraph:
        start = time.perf_counter()
        if self.stream is None:
            self.stream, self.pool = torch.cuda.Stream(self.input_ids.device), torch.cuda.graph_pool_handle()
        batch = self._static_batch(requests, context)
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            self.model(batch, self.cache)  # eager first, on the capture stream (module docstring)
        graph = torch.cuda.CUDAGraph()
        # thread_local: in a server the engine thread captures while other threads may touch CUDA
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
            out = self.model(batch, self.cache)
            for name in ("logits", "hidden", "topk"):
                getattr(self.out, name)[: batch.num_tokens].copy_(getattr(out, name))
        torch.cuda.current_stream().wait_stream(self.stream)
        logger.info("captured a %s graph for %d requests, contexts up to %d, in %.2f s (%d graphs)", self.mode.name,
                    requests, context, time.perf_counter() - start, len(self.graphs) + 1)
        return graph

    def capture_all(self) -> None:
        """Capture every bucket now (start-up), largest first, so that serving captures none."""
        for requests in reversed(self.batch_buckets):
            for context in reversed(self.context_buckets):
                if (requests, context) not in self.graphs:
                    self._pad(0, requests)  # so that the capture's eager run writes the held page only
                    self.graphs[(requests, context)] = self._capture(requests, context)
