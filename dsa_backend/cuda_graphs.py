"""CUDA graphs for decode steps (and a chain's verify and draft steps): one captured forward per
(batch bucket, context bucket).

Eagerly, a decode step is host-bound: every layer's DSA calls cost 0.2-0.6 ms of host time on the
device machine (docs/PERFORMANCE.md, "Host time a call") against microseconds of GPU work. A graph
replays the whole forward's launches at once. A capture fixes every shape, so:
- a batch of b requests runs in the graph of the smallest batch bucket >= b; the requests past b
  are padding: token 0 at positions 0.. of a page held for them (their KV writes land there);
- the launch shapes that follow the longest context (the indexer logits' width, the top-k's
  launch) are the context bucket's, the smallest >= the batch's longest context. Each row still
  reads only its own keys: the kernels take the lengths from the device.
Metadata lives in static buffers (StaticBatch) that a replay fills in place; nothing in the
forward reads back from the GPU (tests/test_models.py checks that under torch's sync debug mode).

Graphs are captured on a bucket's first use. The DSA kernels need one eager call of each shape on
the capture stream first (the top-k's barrier counters and FlashMLA's schedule, kernels/dispatch.py),
so a capture runs the forward eagerly on that stream before recording it, which also compiles its
Triton kernels. The eager run and the replay write the same KV for the step's tokens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

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


class StaticBatch:
    """The metadata of up to max_requests requests of n new tokens each, in buffers that captured
    forwards read and a replay fills in place. logits_rows holds rows_per_request rows a request
    (n: a verify scores every token; 1: its last). pad_page: a page of the cache held for padding
    requests, which nothing else may use; table_width: block table columns."""

    def __init__(self, mode: ForwardMode, max_requests: int, n: int, rows_per_request: int, table_width: int,
                 pad_page: int, page_size: int, device: torch.device):
        self.mode, self.n, self.rows_per_request = mode, n, rows_per_request
        self.page_size, self.pad_page = page_size, pad_page
        tokens, long = max_requests * n, dict(dtype=torch.long, device=device)
        # A padding request's tokens sit at positions 0..n-1, every page of its table the held one.
        self.pad_positions = torch.arange(n, **long).repeat(max_requests)
        self.pad_slots = pad_page * page_size + self.pad_positions % page_size
        # a request's logits rows: every token's, or its last token's
        self.pad_logits_rows = (torch.arange(tokens, **long) if rows_per_request == n
                                else torch.arange(max_requests, **long) * n + n - 1)
        self.input_ids = torch.zeros(tokens, **long)
        self.positions = self.pad_positions.clone()
        self.out_cache_loc = self.pad_slots.clone()
        self.seq_lens = torch.full((max_requests,), n, dtype=torch.int32, device=device)
        self.extend_lens = torch.full((max_requests,), n, dtype=torch.int32, device=device)
        self.block_table = torch.full((max_requests, table_width), pad_page, dtype=torch.int32, device=device)
        self.logits_rows = self.pad_logits_rows.clone()

    @property
    def max_requests(self) -> int:
        return self.seq_lens.shape[0]

    def holds(self, batch: ForwardBatch) -> bool:
        """Whether `batch` fits: its mode, n tokens in every request, no draft trees, within the
        requests and the table's width (pages reserved for drafts may reach past the context)."""
        return (batch.mode is self.mode and batch.tree is None and set(batch.extend_lens_cpu) == {self.n}
                and batch.batch_size <= self.max_requests and batch.block_table.shape[1] <= self.block_table.shape[1]
                and batch.logits_rows.shape[0] == batch.batch_size * self.rows_per_request)

    def fill(self, batch: ForwardBatch, requests: int) -> None:
        """Copy the batch in and make the requests past it, up to `requests`, padding."""
        b, t, width = batch.batch_size, batch.num_tokens, batch.block_table.shape[1]
        self.input_ids[:t].copy_(batch.input_ids)
        self.positions[:t].copy_(batch.positions)
        self.out_cache_loc[:t].copy_(batch.out_cache_loc)
        self.seq_lens[:b].copy_(batch.seq_lens)
        self.block_table[:b, :width].copy_(batch.block_table)
        self.logits_rows[: b * self.rows_per_request].copy_(batch.logits_rows)
        self.pad(b, requests)

    def pad(self, first: int, requests: int) -> None:
        """Requests [first, requests) become padding. Their whole table rows name the held page:
        a chain's draft steps reach past a padding request's n tokens (spec/chain.py)."""
        if requests > first:
            tokens = slice(first * self.n, requests * self.n)
            self.input_ids[tokens] = 0
            self.positions[tokens] = self.pad_positions[tokens]
            self.out_cache_loc[tokens] = self.pad_slots[tokens]
            self.seq_lens[first:requests] = self.n
            self.block_table[first:requests] = self.pad_page
            rows = slice(first * self.rows_per_request, requests * self.rows_per_request)
            self.logits_rows[rows] = self.pad_logits_rows[rows]

    def view(self, requests: int, context: int) -> ForwardBatch:
        """The first `requests` requests as a batch. Its host lengths are the context bucket's:
        they set the launch shapes, which must hold for every batch the graph replays."""
        tokens = requests * self.n
        return ForwardBatch(mode=self.mode, input_ids=self.input_ids[:tokens], positions=self.positions[:tokens],
                            out_cache_loc=self.out_cache_loc[:tokens], seq_lens=self.seq_lens[:requests],
                            extend_lens=self.extend_lens[:requests], seq_lens_cpu=[context] * requests,
                            extend_lens_cpu=[self.n] * requests, block_table=self.block_table[:requests],
                            page_size=self.page_size,
                            logits_rows=self.logits_rows[: requests * self.rows_per_request])


class BucketedGraphs:
    """Graphs of one step over a StaticBatch, by (batch bucket, context bucket), each captured on
    its bucket's first use. `run` is what a graph runs on a view of the static batch; it writes its
    results to static tensors. Every graph of the set allocates from one memory pool, which is
    safe as one graph replays at a time and what a graph makes on the way is dead after it."""

    def __init__(self, static: StaticBatch, max_context: int, run: Callable[[ForwardBatch], None]):
        self.static, self.run = static, run
        self.batch_buckets = batch_buckets(static.max_requests)
        self.context_buckets = context_buckets(max_context)
        self.stream = self.pool = None  # made by the first capture (the rest also runs on the CPU, for tests)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    @property
    def pad_page(self) -> int:
        return self.static.pad_page

    def fits(self, batch: ForwardBatch, max_context: int) -> bool:
        """Whether a replay can serve `batch`, whose steps reach max_context keys."""
        return self.static.holds(batch) and max_context <= self.context_buckets[-1]

    def replay(self, batch: ForwardBatch, max_context: int) -> None:
        """Fill the static batch from `batch` and replay its bucket's graph (captured now if new)."""
        requests = _bucket(self.batch_buckets, batch.batch_size)
        context = _bucket(self.context_buckets, max_context)
        self.static.fill(batch, requests)
        if self.static.input_ids.device.type != "cuda":  # no graphs: the step runs eagerly on the buffers (tests)
            self.run(self.static.view(requests, context))
            return
        key = (requests, context)
        if key not in self.graphs:
            self.graphs[key] = self._capture(requests, context)
        self.graphs[key].replay()

    def _capture(self, requests: int, context: int) -> torch.cuda.CUDAGraph:
        start = time.perf_counter()
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.static.input_ids.device)
            self.pool = torch.cuda.graph_pool_handle()
        batch = self.static.view(requests, context)
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            self.run(batch)  # eager first, on the capture stream (module docstring)
        graph = torch.cuda.CUDAGraph()
        # thread_local: in a server the engine thread captures while other threads may touch CUDA
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
            self.run(batch)
        torch.cuda.current_stream().wait_stream(self.stream)
        logger.info("captured a %s graph for %d requests, contexts up to %d, in %.2f s (%d graphs)",
                    self.static.mode.name, requests, context, time.perf_counter() - start, len(self.graphs) + 1)
        return graph

    def release(self) -> None:
        """Destroy every captured graph. NCCL destroys no communicator while graphs that captured
        its collectives exist: destroy_process_group waits for them forever (pytorch#115388)."""
        for graph in self.graphs.values():
            graph.reset()
        self.graphs.clear()

    def capture_all(self) -> None:
        """Capture every bucket now (start-up), largest first, so that serving captures none."""
        for requests in reversed(self.batch_buckets):
            for context in reversed(self.context_buckets):
                if (requests, context) not in self.graphs:
                    self.static.pad(0, requests)  # so that the capture's eager run writes the held page only
                    self.graphs[(requests, context)] = self._capture(requests, context)


class DecodeGraphs(BucketedGraphs):
    """Captured decode-like forwards of `model` over `cache`: n = tokens_per_request new tokens a
    request, DECODE for 1, a chain's TARGET_VERIFY (root and drafts) for more. Replayed for
    batches of up to max_batch requests whose contexts reach at most max_context tokens."""

    def __init__(self, model: DsaForCausalLM, cache: KVCache, max_batch: int, max_context: int, pad_page: int,
                 tokens_per_request: int = 1):
        n = tokens_per_request
        mode = ForwardMode.DECODE if n == 1 else ForwardMode.TARGET_VERIFY
        device = cache.mla.buffer.device
        super().__init__(StaticBatch(mode, max_batch, n, n, pages_needed(max_context, cache.page_size), pad_page,
                                     cache.page_size, device), max_context, self._forward_to_out)
        self.model, self.cache, self.n, self.mode = model, cache, n, mode
        # What the graphs replay is this backend's launches: a forward with another one set on the
        # model (a test or benchmark comparing backends) takes the eager path.
        self.backend = model.backend
        # Every graph writes its outputs here, so that what a graph makes on the way, its logits
        # included, is pool memory the next capture reuses: a graph's own [tokens, vocab] fp32
        # logits, kept for each of ~100 buckets, would hold GBs.
        c, tokens = model.config, max_batch * n
        self.out = ForwardOutput(logits=torch.zeros(tokens, c.vocab_size, device=device),
                                 hidden=torch.zeros(tokens, c.hidden_size, dtype=model.model.embed_tokens.weight.dtype,
                                                    device=device),
                                 topk=torch.zeros(tokens, c.index_topk, dtype=torch.int32, device=device))

    def serves(self, batch: ForwardBatch) -> bool:
        """A batch of this mode with n tokens in every request, in position order (no draft
        trees: those take the eager path), within the buckets, for the captured backend."""
        return self.model.backend is self.backend and self.fits(batch, batch.max_seq_len)

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        """The model's forward of `batch` by graph replay. The outputs are views of static
        tensors: valid until the next replay."""
        self.replay(batch, batch.max_seq_len)
        t = batch.num_tokens
        return ForwardOutput(self.out.logits[:t], self.out.hidden[:t], self.out.topk[:t])

    def _forward_to_out(self, batch: ForwardBatch) -> None:
        out = self.model(batch, self.cache)
        for name in ("logits", "hidden", "topk"):
            getattr(self.out, name)[: batch.num_tokens].copy_(getattr(out, name))
