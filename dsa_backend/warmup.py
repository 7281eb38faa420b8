"""Start-up warm-up: compile the DSA kernels for the shapes serving will meet, before serving.

Triton compiles a kernel on the first call of each config, and the DSA kernels' configs follow the
batch: the paged indexer's key chunks and the top-k's launch follow the rows and the longest
context, sparse MLA's split and grid the rows (kernels/specialization.py keeps the step-varying
integers from adding variants of their own). A cold server compiled for 30-36 s on its first
requests, and again on the first step of each new batch size or context bucket (H100,
docs/PERFORMANCE.md, "Compiles in the middle of serving").

`warm_up_fp8_gemms` does the same for the GEMMs of FP8 weights kept in e4m3, whose tiles and K
splits follow a step's rows (kernels/fp8_gemm.py). Where DeepGEMM takes a weight, it also measures
the row counts at which DeepGEMM's GEMM runs faster on two row halves (kernels/deepgemm_rows.py),
which compiles DeepGEMM's kernel for every 64 rows a step can have.

`warm_up` calls the model's own DSA backend over those shapes, for every step shape the engine's
limits allow: decode (and speculative verify) at every batch size up to max_running_requests over a
ladder of contexts up to the longest, sparse MLA at every row count a step can have, and prefill
pieces over a ladder of token counts and request lengths. It calls them inside
dsa_kernels.compile_only: each Triton launch compiles its config and does not run, the compiles on
a pool of threads (Triton starts each config once), so that the warm-up costs the compiles and
the host's calls, not thousands of kernels run over long contexts. Every request of a warm-up
batch reads the same pages of the first layers' pools (random keys, written once), so it needs
one longest request's pages, which it frees after. Nothing is compiled on the CPU: there it
returns at once.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import torch

from dsa_backend.attention import (EXTEND_LOGITS_BYTES, KernelDsaBackend, default_backend, gathers_fp8_rows,
                                   heads_padded, positions_to_slots)
from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.cache import KVCache, pages_needed
from dsa_backend.config import ModelConfig
from dsa_backend.models.fp8_linear import Fp8Linear
from dsa_backend.models.moe import Experts
import dsa_kernels
from dsa_kernels.deepgemm_rows import row_ranges
from dsa_kernels.dispatch import DEEPGEMM_GROUPED_PAIRS
from dsa_kernels.fp8_gemm import grouped_tiles, launch_config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WarmupShapes:
    """The engine's limits on a step: requests, tokens, the longest context, draft tokens a request."""

    max_running_requests: int
    max_num_batched_tokens: int
    max_context_len: int
    tokens_per_verify: int = 1   # speculative decoding: num_draft_tokens (1: none)
    draft_rows: int = 1          # tree drafting: frontier nodes a request in a draft step

    @property
    def decode_rows(self) -> int:
        """Query rows of a decode-like step: a token a request, or a draft tree's nodes, or
        verify tokens walking alone (uneven counts: one row a token)."""
        per_request = max(self.tokens_per_verify, self.draft_rows)
        return min(self.max_running_requests * per_request, self.max_num_batched_tokens)


def ladder(largest: int, step: int, dense_up_to: int, grow: float) -> list[int]:
    """step, 2 * step, ... up to dense_up_to (where chunk and split choices change fastest), then
    each at most `grow` larger (rounded up to a multiple of step), every power of two (where the
    top-k's spans change), and largest."""
    points, n = {largest}, step
    while n < largest:
        points.add(n)
        n = n + step if n < dense_up_to else -(-int(n * (1 + grow)) // step) * step
    points.update(1 << i for i in range(largest.bit_length()) if step <= 1 << i < largest)
    return sorted(points)


def context_ladder(longest: int, page_size: int) -> list[int]:
    """Decode contexts: every page up to 1024 tokens, then at most 1/4 longer each; each also one
    token short, for kernels that specialize a length on its divisibility (the Triton paged indexer)."""
    return sorted({p - d for p in ladder(longest, page_size, 1024, 1 / 4) for d in (0, 1) if p - d >= 1})


def prefill_ladder(largest: int) -> list[int]:
    """Token and key counts of prefill pieces: every count up to 8, then at most 1/4 more each."""
    return ladder(largest, 1, 8, 1 / 4)


# A warm-up call: ("indexer", requests, tokens, context, mode) or ("mla", rows, mode).
Call = tuple


def warmup_calls(shapes: WarmupShapes, longest: int, page_size: int) -> dict[str, list[Call]]:
    """Every call of the warm-up, by phase, in the order they run."""
    return {"decode": _decode_calls(shapes, longest, page_size), "attention": _attention_calls(shapes),
            "prefill": _prefill_calls(shapes, longest)}


def default_threads() -> int:
    """A compile thread for each CPU core this process may use, at most 16."""
    return max(1, min(16, len(os.sched_getaffinity(0))))


def warm_up(cache: KVCache, config: ModelConfig, shapes: WarmupShapes, threads: int = 0) -> int:
    """Compile the model's DSA backend for every step shape of `shapes` (dsa_kernels.compile_only,
    on `threads` compile threads; 0: one after another in this thread); returns the number of calls."""
    device = cache.mla.buffer.device
    backend = default_backend(device)
    if not isinstance(backend, KernelDsaBackend):  # the CPU's reference compiles nothing
        return 0
    longest = min(shapes.max_context_len, cache.allocator.num_pages * cache.page_size)
    pages = cache.allocator.allocate(pages_needed(longest, cache.page_size))
    total, start = 0, time.perf_counter()
    try:
        run = _Runner(cache, config, backend, pages, longest, max_rows=shapes.max_num_batched_tokens)
        with dsa_kernels.compile_only(threads):
            for phase, calls in warmup_calls(shapes, longest, cache.page_size).items():
                phase_start = time.perf_counter()
                for call in calls:
                    run(call)
                logger.info("DSA kernel warm-up, %s: %d calls in %.1f s", phase, len(calls),
                            time.perf_counter() - phase_start)
                total += len(calls)
            if threads:
                logger.info("DSA kernel warm-up: waiting for the compiles on %d threads", threads)
    finally:
        cache.allocator.free(pages)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    logger.info("DSA kernel warm-up: %d calls compiled in %.1f s", total, time.perf_counter() - start)
    return total


def _decode_calls(shapes: WarmupShapes, longest: int, page_size: int) -> list[Call]:
    """Indexer top-k of n tokens a request: decode, verify, and draft-extend where every request
    accepted n - 1 drafts; at every batch size over the context ladder."""
    calls, contexts = [], context_ladder(longest, page_size)
    for n in range(1, shapes.tokens_per_verify + 1):
        rows = shapes.decode_rows if n == 1 else min(shapes.max_running_requests, shapes.max_num_batched_tokens // n)
        mode = ForwardMode.DECODE if n == 1 else ForwardMode.TARGET_VERIFY
        calls += [("indexer", batch, n, max(context, n), mode) for batch in range(1, rows + 1)
                  for context in contexts]
    return calls


def _attention_calls(shapes: WarmupShapes) -> list[Call]:
    """Sparse MLA at every row count of a decode-like step and of a prefill step."""
    decode_rows = max(shapes.decode_rows, shapes.tokens_per_verify)
    return ([("mla", n, ForwardMode.DECODE) for n in range(1, decode_rows + 1)]
            + [("mla", n, ForwardMode.EXTEND) for n in range(1, shapes.max_num_batched_tokens + 1)])


def _prefill_calls(shapes: WarmupShapes, longest: int) -> list[Call]:
    """Indexer top-k of prefill pieces of `tokens` rows whose longest request has `keys` keys (what
    the top-k's launch follows; the piece's logits hold its requests' keys side by side): one
    request, or where its keys are fewer than the rows, several of `keys` keys each."""
    calls = []
    for tokens in prefill_ladder(shapes.max_num_batched_tokens):
        for keys in prefill_ladder(min(longest, EXTEND_LOGITS_BYTES // 4 // tokens)):
            requests = -(-tokens // keys)
            if requests <= shapes.max_running_requests:
                calls.append(("indexer", requests, tokens // requests, keys, ForwardMode.EXTEND))
    return calls


def fp8_linear_rows(n: int, k: int, max_rows: int, device: torch.device) -> list[int]:
    """Row counts that give an [n, k] FP8 GEMM every launch it can take for up to max_rows rows:
    the first of each of our launch configs, and the prefill ladder for DeepGEMM's own choices."""
    rows, configs = set(prefill_ladder(max_rows)), set()
    for m in range(1, max_rows + 1):
        config = launch_config(m, n, k, device)
        if config not in configs:
            configs.add(config)
            rows.add(m)
    return sorted(rows)


@torch.no_grad()
def warm_up_fp8_gemms(model: torch.nn.Module, max_rows: int, experts_per_token: int) -> int:
    """Run each FP8 weight shape of the model over every launch a step of up to max_rows tokens
    can take (fp8_linear_rows; the routed experts at each tile of their runs' mean length, and
    over the prefill ladder where DeepGEMM takes them), and calibrate DeepGEMM's row halves for
    each weight it takes (calibrate_fp8_linear); returns the number of calls (calibration aside)."""
    calls, seen = 0, set()
    for module in model.modules():
        if isinstance(module, Fp8Linear):
            key = (tuple(module.weight.shape), tuple(module.weight_scale_inv.shape))
            if key in seen:
                continue
            seen.add(key)
            x = torch.randn(max_rows, module.in_features, device=module.weight.device,
                            dtype=model.model.embed_tokens.weight.dtype)
            for m in fp8_linear_rows(module.out_features, module.in_features, max_rows, x.device):
                module(x[:m])
                calls += 1
            split = dsa_kernels.calibrate_fp8_linear(module.weight, module.weight_scale_inv, max_rows)
            if split:
                logger.info("FP8 GEMM %s on DeepGEMM: rows in %s run as two halves (faster)", tuple(module.weight.shape),
                            row_ranges(split))
        elif isinstance(module, Experts) and module.w13_scale_inv is not None:
            groups, hidden = module.w13.shape[0], module.w13.shape[2]
            # k distinct experts a token, every expert's run of about the same length; from
            # DEEPGEMM_GROUPED_PAIRS pairs its choices follow the rows, as for the dense layers
            tokens_for = {grouped_tiles(t * experts_per_token, groups): t for t in range(max_rows, 0, -1)}
            on_deepgemm = {t for t in prefill_ladder(max_rows) if t * experts_per_token >= DEEPGEMM_GROUPED_PAIRS}
            for tokens in sorted(set(tokens_for.values()) | on_deepgemm):
                ids = (torch.arange(tokens * experts_per_token, device=module.w13.device) % groups).view(tokens, -1)
                x = torch.randn(tokens, hidden, device=ids.device, dtype=model.model.embed_tokens.weight.dtype)
                module(x, ids, torch.ones(ids.shape, device=ids.device))
                calls += 1
    return calls


class _Runner:
    """Calls of the backend over batches whose requests all read `pages` (random keys and latents)."""

    def __init__(self, cache: KVCache, config: ModelConfig, backend, pages: list[int], longest: int, max_rows: int):
        self.cache, self.backend = cache, backend
        self.device = cache.mla.buffer.device
        self.page_size = cache.page_size
        self.table = torch.tensor(pages, dtype=torch.int32, device=self.device)
        self.topk, self.longest = config.index_topk, longest
        self.index_scale = config.index_head_dim ** -0.5
        self.mla_scale = (config.kv_lora_rank + config.qk_rope_head_dim) ** -0.5
        self.index_layer = next(iter(cache.indexer.index_of_layer))
        gen = torch.Generator(device=self.device).manual_seed(0)
        slots = torch.arange(longest, device=self.device)
        slots = self.table.long()[slots // self.page_size] * self.page_size + slots % self.page_size
        cache.indexer.store(self.index_layer, slots, torch.randn(longest, config.index_head_dim, device=self.device,
                                                                 generator=gen))
        cache.mla.store(0, slots, torch.randn(longest, config.kv_lora_rank, device=self.device, generator=gen),
                        torch.randn(longest, config.qk_rope_head_dim, device=self.device, generator=gen))
        dtype = cache.mla.dtype  # the model's
        self.q_index = torch.randn(max_rows, config.index_n_heads, config.index_head_dim, device=self.device,
                                   generator=gen).to(dtype)
        self.w_index = torch.randn(max_rows, config.index_n_heads, device=self.device, generator=gen)
        self.q_mla = torch.randn(max_rows, config.num_attention_heads, config.kv_lora_rank + config.qk_rope_head_dim,
                                 device=self.device, generator=gen).to(dtype)

    def batch(self, mode: ForwardMode, requests: int, tokens: int, context: int) -> ForwardBatch:
        """`requests` requests of `tokens` new tokens each, the last at position context - 1."""
        rows = requests * tokens
        positions = (torch.arange(tokens, device=self.device) + context - tokens).repeat(requests)
        return ForwardBatch(mode=mode, input_ids=torch.zeros(rows, dtype=torch.long, device=self.device),
                            positions=positions, out_cache_loc=positions,
                            seq_lens=torch.full((requests,), context, dtype=torch.int32, device=self.device),
                            extend_lens=torch.full((requests,), tokens, dtype=torch.int32, device=self.device),
                            seq_lens_cpu=[context] * requests, extend_lens_cpu=[tokens] * requests,
                            block_table=self.table.expand(requests, -1), page_size=self.page_size,
                            logits_rows=torch.arange(rows, device=self.device))

    def __call__(self, call: Call) -> None:
        if call[0] == "indexer":
            self.indexer(*call[1:])
        else:
            self.mla_rows(*call[1:])

    def indexer(self, requests: int, tokens: int, context: int, mode: ForwardMode) -> None:
        batch = self.batch(mode, requests, tokens, context)
        rows = batch.num_tokens
        self.backend.indexer_topk(self.q_index[:rows], self.w_index[:rows], self.cache.indexer, self.index_layer, batch,
                                  self.topk, self.index_scale)

    def mla_rows(self, n: int, mode: ForwardMode) -> None:
        """Sparse MLA at n rows (prefill: one request's rows; decode: a row a request), over top-k
        positions within the written keys (it reads no other position)."""
        positions = torch.arange(self.topk, dtype=torch.int32, device=self.device) % self.longest
        batch = self.batch(mode, 1, n, self.longest) if mode is ForwardMode.EXTEND else self.batch(mode, n, 1, 1)
        self.backend.sparse_mla(self.q_mla[:n], self.cache.mla, 0, batch, positions.expand(n, -1), self.mla_scale)
        if mode is ForwardMode.EXTEND and self.cache.mla.fp8:
            q = heads_padded(self.q_mla[:n])
            if gathers_fp8_rows(batch, q, self.topk):  # the step gathered: as many rows among
                # longer contexts take the FP8 decode kernel instead
                slots = positions_to_slots(batch, positions.expand(n, -1)).contiguous()
                dsa_kernels.sparse_mla_decode(q, self.cache.mla.buffer[0], slots, self.mla_scale)
