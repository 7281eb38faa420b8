"""Engine: one step = schedule, forward, sample, append, stop checks, free pages.

The Engine is single-threaded; EngineRunner (runner.py) owns one on a background thread, and
EngineProcess (engine_process.py) runs that in a process of its own, which is what the Triton
model talks to.
"""

from __future__ import annotations

import itertools
import logging
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.cache import KVCache, pages_needed
from dsa_backend.config import ModelConfig
from dsa_backend.cuda_graphs import DecodeGraphs
from dsa_backend.followers import Followers
from dsa_backend.guided import Grammars
from dsa_backend.models import load_model
from dsa_backend.models.model import ForwardOutput
from dsa_backend.parallel import TensorParallel, join_group, listen, shares_one_gpu
from dsa_backend.sampling import (SamplingBatch, SamplingRow, check_vocab, make_generator, process_logits,
                                  sample, sampling_probs, token_logprobs)
from dsa_backend.sampling_params import SamplingParams
from dsa_backend.scheduler import ScheduledChunk, Scheduler
from dsa_backend.sequence import Sequence, with_pending_tokens
from dsa_backend.spec.acceptance import accept_greedy, draw_for_judging, judge_chains, judge_trees_now
from dsa_backend.spec.chain import ChainDraftGraphs
from dsa_backend.spec.compaction import compact_accepted_path
from dsa_backend.spec.config import SpecConfig
from dsa_backend.spec.drafter import ChainDrafts, DraftInput, MtpDrafter
from dsa_backend.spec.tree import ROOT_ONLY
from dsa_backend.token_counts import TokenCounts
from dsa_backend.transfer import HostCopy, to_device
from dsa_backend.kernel_loads import watch
from dsa_backend.warmup import WarmupShapes, default_threads, warm_up, warm_up_fp8_gemms
from dsa_kernels.batch_invariant import enable_batch_invariant_mode

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Without a GPU there is no memory to size the pools from; this many pages is ample for tests.
_CPU_DEFAULT_PAGES = 256
FP8_WEIGHT_CHOICES = ("auto", "keep", "dequantize")


@dataclass(frozen=True)
class EngineArgs:
    model: str
    device: str = "auto"                 # auto: cuda when available, else cpu
    dtype: str = "auto"                  # auto: bfloat16 on cuda, float32 on cpu
    page_size: int = 64
    num_kv_pages: int | None = None      # None: from free GPU memory (gpu_memory_utilization)
    gpu_memory_utilization: float = 0.85
    kv_cache_dtype: str = "auto"         # auto: MLA in the model dtype, FP8 indexer keys on CUDA; fp8: both FP8
    max_running_requests: int = 64
    max_num_batched_tokens: int = 2048   # token budget of one step (the prefill chunk size)
    max_model_len: int | None = None     # None: the checkpoint's max_position_embeddings
    seed: int = 0
    batch_invariant: bool = False        # GPU: row-invariant GEMM / norm kernels, so greedy output is batch-invariant
    speculative_algorithm: str | None = None  # "mtp" / "eagle": draft with the checkpoint's MTP layer
    speculative_num_steps: int = 1
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int | None = None
    warmup: bool = False                 # CUDA: compile the DSA kernels for every step shape at start (warmup.py)
    warmup_threads: int | None = None    # threads compiling the warm-up's kernels; None: auto; 0: one at a time
    cuda_graph: bool = True              # CUDA, bf16: decode (MTP chain: verify) steps replay graphs (cuda_graphs.py)
    overlap_schedule: bool = True        # no speculation: build step n + 1 while the GPU runs step n
    fp8_weights: str = "auto"            # FP8 checkpoints: keep (e4m3 GEMMs) / dequantize; auto: keep on CUDA >= sm89
    enable_prefix_caching: bool = True   # reuse the KV pages of a cached token prefix (cache/prefix_cache.py)
    tensor_parallel_size: int = 1        # GPUs (processes) sharing each layer (parallel.py, followers.py)

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def rank_device(self, rank: int) -> torch.device:
        """Tensor-parallel rank `rank`'s device: the rank-th GPU from the resolved one (every rank on
        that one with parallel.SHARE_ONE_GPU set, for checks on a machine of one GPU)."""
        device = self.resolved_device()
        if device.type != "cuda":
            return device
        return torch.device("cuda", (device.index or 0) + (0 if shares_one_gpu() else rank))

    def keeps_fp8_weights(self, device: torch.device) -> bool:
        """Whether an FP8 checkpoint's weights stay e4m3: "auto" keeps them where our FP8 GEMMs
        compile (CUDA, compute capability 8.9 and up); elsewhere they would run on the reference,
        which dequantizes every call."""
        if self.fp8_weights not in FP8_WEIGHT_CHOICES:
            raise ValueError(f"fp8_weights must be one of {', '.join(FP8_WEIGHT_CHOICES)}; got {self.fp8_weights!r}")
        if self.fp8_weights == "auto":
            return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)
        return self.fp8_weights == "keep"

    def resolved_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of auto, {', '.join(_DTYPES)}; got {self.dtype!r}")
        return _DTYPES[self.dtype]


@dataclass(frozen=True)
class _SampledStep:
    """A step's sampled tokens: on the GPU for the next step's inputs, and on their way to the host."""

    seqs: list[Sequence]        # row i's request
    token_ids: torch.Tensor     # [rows] on the device
    host: HostCopy              # token ids, then TokenLogprobs' three (None unless asked for)


class Logprob(NamedTuple):
    """An output token's logprob, and the most likely tokens' (token id, logprob) there when the
    request asked for top_logprobs (else empty)."""

    value: float
    top: tuple[tuple[int, float], ...]


_NO_LOGPROBS = (None, None, None)     # TokenLogprobs' three, for a step that computed none


def logprobs_at(params: SamplingParams, host: list[list | None], row: int) -> Logprob | None:
    """Row `row` of a step's TokenLogprobs read back (chosen, top values, top ids), for a request
    with these params; None when the step computed none."""
    chosen, top_values, top_ids = host
    if chosen is None:
        return None
    k = params.top_logprobs
    return Logprob(chosen[row], tuple(zip(top_ids[row][:k], top_values[row][:k])) if k else ())


@dataclass(frozen=True)
class RequestOutput:
    """What one engine step produced for one request."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[float] | None
    cumulative_logprob: float | None
    finished: bool
    finish_reason: str | None          # stop | length | abort | error
    num_prompt_tokens: int
    num_output_tokens: int
    error: str | None = None
    num_draft_tokens: int = 0            # speculative decoding, cumulative for the request
    num_accepted_draft_tokens: int = 0
    num_cached_tokens: int = 0           # prompt tokens found in the prefix cache, not computed
    # SamplingParams.prompt_logprobs: one a prompt token, None for the first (nothing predicts it);
    # on the output that carries the request's first tokens
    prompt_logprobs: list[float | None] | None = None
    # SamplingParams.top_logprobs: for each new token, the most likely tokens' (token id, logprob)
    new_top_logprobs: list[tuple[tuple[int, float], ...]] | None = None


@dataclass(frozen=True)
class RequestLimits:
    """What a request must fit to be served at all: the engine's fixed limits, which a serving
    process checks too before a request reaches an engine in another process (engine_process.py)."""

    vocab_size: int
    max_model_len: int
    page_size: int
    num_kv_pages: int
    lookahead: int = 0      # speculative decoding: draft slots written past a request's end

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise ValueError naming the problem if the request can never be served."""
        if not prompt_ids:
            raise ValueError("the prompt is empty: at least one token is needed")
        if any(not 0 <= t < self.vocab_size for t in prompt_ids):
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size})")
        check_vocab(params, self.vocab_size)
        if params.n != 1:
            raise ValueError(f"n={params.n}: the engine runs one sample a request; submit each of "
                             "SamplingParams.samples() as a request (LLM.generate and dsa_llm do)")
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the model's context is "
                             f"{self.max_model_len} (max_model_len), which leaves no room to generate")
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise ValueError(f"max_tokens ({params.max_tokens}) plus the prompt ({len(prompt_ids)} tokens) "
                             f"exceeds the context limit max_model_len={self.max_model_len}")
        worst = pages_needed(len(prompt_ids) + params.max_tokens + self.lookahead, self.page_size)
        if worst > self.num_kv_pages:
            raise ValueError(f"prompt plus max_tokens needs {worst} KV pages; the pool has "
                             f"{self.num_kv_pages} in all")


class Engine:
    """One rank's engine. Under tensor parallelism rank 0 is built with tp None: it spawns the
    other ranks (followers.py), which are built with their place in the group and repeat its
    add_request, abort and step calls."""

    def __init__(self, args: EngineArgs, tp: TensorParallel | None = None):
        for name in ("page_size", "max_running_requests", "max_num_batched_tokens", "tensor_parallel_size"):
            if getattr(args, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(args, name)}")
        if args.warmup_threads is not None and args.warmup_threads < 0:
            raise ValueError(f"warmup_threads must be 0 or more, got {args.warmup_threads}")
        self.args = args
        config = ModelConfig.from_pretrained(args.model)
        self.followers = None
        try:
            self._build(args, config, tp if tp is not None else self._lead_group(args, config))
        except BaseException:
            self.close()    # the followers fail alike, or would wait for this rank for good
            raise
        if self.followers is not None:
            self.followers.started()

    def _build(self, args: EngineArgs, config: ModelConfig, tp: TensorParallel) -> None:
        """This rank's model, pools, scheduler, graphs and warm-up."""
        self.tp = tp
        self.device = args.rank_device(tp.rank)
        self.make_current()
        self.dtype = args.resolved_dtype(self.device)
        if args.batch_invariant:
            enable_batch_invariant_mode(self.device)
        self.model, info = load_model(args.model, self.dtype, self.device, config,
                                      keep_fp8=args.keeps_fp8_weights(self.device), tp=tp)
        self.config = self.model.config  # this rank's sizes
        self.max_model_len = args.max_model_len or self.config.max_position_embeddings
        self.spec = self._spec_config(args, info.mtp_has_indexer)
        # before the pools take what memory is left
        self.token_counts = TokenCounts(args.max_running_requests, self.config.vocab_size, self.device)
        # every rank must have the same pages, or their schedules part
        self.num_kv_pages = args.num_kv_pages or tp.min_over_ranks(self._pages_from_memory(), self.device)
        self.limits = RequestLimits(self.config.vocab_size, self.max_model_len, args.page_size, self.num_kv_pages,
                                    lookahead=self.spec.lookahead if self.spec else 0)
        # Graphs serve decode steps, or a chain's verify steps (a tree's verify and the draft steps
        # run eagerly). The routed experts' grouped GEMM reads its group sizes back to the host,
        # which a capture cannot, everywhere but in bfloat16 (torch's fallback for other dtypes,
        # and the batch-invariant one).
        graphs = (args.cuda_graph and self.device.type == "cuda" and self.dtype == torch.bfloat16
                  and (not self.spec or self.spec.is_chain) and not args.batch_invariant and tp.captures_in_graphs)
        # A page for the graphs' padding rows, and for a chain's draft writes past a request's pages
        self.num_held_pages = 1 if graphs or (self.spec and self.spec.is_chain) else 0
        warmup_shapes = self._warmup_shapes() if args.warmup else None
        self.cache = KVCache(self.config, self.num_kv_pages + self.num_held_pages, args.page_size, dtype=self.dtype,
                             kv_cache_dtype=args.kv_cache_dtype, mtp_has_indexer=info.mtp_has_indexer,
                             device=self.device)
        held_page = self.cache.allocator.allocate(1)[0] if self.num_held_pages else None
        n = self.spec.num_draft_tokens if self.spec else 1
        self.graphs = (DecodeGraphs(self.model, self.cache, args.max_running_requests, self.max_model_len,
                                    pad_page=held_page, tokens_per_request=n) if graphs else None)
        self.grammars = Grammars(args.model, self.config.vocab_size)
        self.scheduler = Scheduler(self.cache.allocator, args.page_size, args.max_running_requests,
                                   args.max_num_batched_tokens, prefix_caching=args.enable_prefix_caching)
        self.generator = torch.Generator(device=self.device).manual_seed(args.seed)
        self.drafter = None
        if self.spec:
            draft_graphs = (ChainDraftGraphs(self.model, self.cache, self.spec.num_steps, self.spec.reuses_topk,
                                             args.max_running_requests, self.max_model_len, held_page)
                            if graphs else None)
            self.drafter = MtpDrafter(self.model, self.cache, self.spec, args.page_size, self.device, held_page,
                                      draft_graphs)
        if warmup_shapes:
            warm_up(self.cache, self.config, warmup_shapes,
                    args.warmup_threads if args.warmup_threads is not None else default_threads())
            if self.device.type == "cuda":  # the references on the CPU compile nothing
                warm_up_fp8_gemms(self.model, args.max_num_batched_tokens, self.config.num_experts_per_tok)
            if self.graphs:
                self.graphs.capture_all()
            if self.drafter and self.drafter.graphs:
                self.drafter.graphs.capture_all()
        self.sequences: dict[str, Sequence] = {}
        # Guided requests whose grammars compile (Grammars.compile): queued once compiled
        self._compiling: dict[str, Future] = {}
        self._arrivals = itertools.count()
        # Overlap scheduling (docs/ENGINE.md): the last step's tokens, read back during the next step
        self.overlap = args.overlap_schedule and not self.spec
        self._unread: _SampledStep | None = None
        # A chain's drafts of the last step, read back while the next verify step runs
        self._unread_drafts: ChainDrafts | None = None
        weights = list(self.model.parameters())
        fp8 = sum(w.numel() for w in weights if w.dtype == torch.float8_e4m3fn)
        logger.info("engine ready: %s on %s/%s, weights %.2f GiB (%.0f%% in e4m3), %d KV pages of %d tokens",
                    self.config.architecture, self.device, self.dtype,
                    sum(w.numel() * w.element_size() for w in weights) / 2**30,
                    100 * fp8 / sum(w.numel() for w in weights), self.num_kv_pages, args.page_size)
        # from here on, each kernel Triton loads is a step that waited for it
        self.kernel_loads = watch()
        loads = self.kernel_loads
        self._loads_before_ready = (loads.count, loads.seconds) if loads else (0, 0.0)

    def _lead_group(self, args: EngineArgs, config: ModelConfig) -> TensorParallel:
        """Rank 0's group: alone, or with followers spawned for the other ranks."""
        if args.tensor_parallel_size == 1:
            return TensorParallel()
        config.sharded(args.tensor_parallel_size)   # a size that does not divide the model fails here
        device = args.resolved_device()
        if (device.type == "cuda" and not shares_one_gpu()
                and (device.index or 0) + args.tensor_parallel_size > torch.cuda.device_count()):
            raise ValueError(f"tensor_parallel_size={args.tensor_parallel_size} needs that many GPUs from {device}; "
                             f"this machine has {torch.cuda.device_count()}")
        store = listen(args.tensor_parallel_size)
        self.followers = Followers(args, store.port)
        return join_group(0, args.tensor_parallel_size, store, args.rank_device(0))

    def make_current(self) -> None:
        """Make this engine's GPU the calling thread's current device. Triton launches a kernel on
        the current device (a tensor on another one fails its pointer check), and torch keeps one
        a thread: a thread that runs steps calls this first."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    def close(self) -> None:
        """Stop the other tensor-parallel ranks, if any, and leave the group (a lone engine needs
        no closing). Every rank leaves at once: NCCL's teardown on one rank can wait for the
        others', so a follower waited out its exit grace for rank 0, which waited for it."""
        followers, self.followers = self.followers, None
        if followers is not None:
            followers.ask_to_close()
        tp = getattr(self, "tp", None)
        if tp is not None and tp.size > 1 and torch.distributed.is_initialized():
            drafter = getattr(self, "drafter", None)
            for graphs in (getattr(self, "graphs", None), drafter.graphs if drafter else None):
                if graphs is not None:
                    graphs.release()     # before the group: NCCL waits for graphs that captured it
            torch.distributed.destroy_process_group()
        if followers is not None:
            followers.close()

    def _repeat(self, method: str, *args) -> None:
        """Have the other tensor-parallel ranks make this call too."""
        if self.followers is not None:
            self.followers.repeat(method, *args)

    def _spec_config(self, args: EngineArgs, mtp_has_indexer: bool) -> SpecConfig | None:
        if args.speculative_algorithm is None:
            return None
        spec = SpecConfig(args.speculative_algorithm, args.speculative_num_steps, args.speculative_eagle_topk,
                          args.speculative_num_draft_tokens)
        if self.config.num_nextn_predict_layers < 1:
            raise ValueError(f"speculative_algorithm={spec.algorithm!r} drafts with the checkpoint's MTP layer, "
                             "but its num_nextn_predict_layers is 0")
        if not spec.is_chain and not mtp_has_indexer:
            # Tree draft steps need top-k over each node's own ancestors; reusing the previous
            # step's top-k is valid only for chains.
            raise ValueError(f"speculative_eagle_topk={spec.topk} (tree drafting) needs an MTP layer with its own "
                             "indexer, and this checkpoint's has none; use speculative_eagle_topk 1")
        return spec

    def _warmup_shapes(self) -> WarmupShapes:
        """The engine's limits on a step, its longest context no longer than its pools hold."""
        pool_tokens = self.num_kv_pages * self.args.page_size  # the held page aside
        return WarmupShapes(self.args.max_running_requests, self.args.max_num_batched_tokens,
                            min(self.max_model_len, pool_tokens),
                            tokens_per_verify=self.spec.num_draft_tokens if self.spec else 1,
                            draft_rows=self.spec.topk if self.spec else 1)

    def _pages_from_memory(self) -> int:
        if self.device.type != "cuda":
            return _CPU_DEFAULT_PAGES
        free, total = torch.cuda.mem_get_info(self.device)
        budget = free - (1 - self.args.gpu_memory_utilization) * total
        per_page = KVCache.bytes_per_page(self.config, self.args.page_size, self.args.kv_cache_dtype, self.dtype,
                                          self.device)
        if budget < per_page:
            raise ValueError(f"gpu_memory_utilization={self.args.gpu_memory_utilization} leaves no memory "
                             f"for the KV cache ({free / 2**30:.1f} GiB free of {total / 2**30:.1f})")
        return int(budget // per_page)

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams, priority: int = 0) -> None:
        """Queue a request (a lower priority number is served first: scheduler.py); bad input
        raises ValueError naming the problem."""
        if request_id in self.sequences:
            raise ValueError(f"request_id {request_id!r} is already in flight")
        self.limits.validate(prompt_ids, params)
        self._repeat("add_request", request_id, prompt_ids, params, priority)
        seq = Sequence(request_id, list(prompt_ids), params, next(self._arrivals), priority=priority,
                       generator=make_generator(params.seed, self.device))
        self.sequences[request_id] = seq
        if params.guided_decoding:
            stops = {*self.config.eos_token_ids, *params.stop_token_ids}
            self._compiling[request_id] = self.grammars.compile(params.guided_decoding, stops)
        else:
            self.scheduler.add(seq)

    def abort(self, request_id: str) -> RequestOutput | None:
        """End a request now and free its pages; None if it is not in flight."""
        self._repeat("abort", request_id)
        seq = self.sequences.pop(request_id, None)
        if seq is None:
            return None
        self._compiling.pop(request_id, None)
        self.scheduler.finish(seq, "abort")
        return self._output(seq, [], [])

    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self._compiling) or (self._unread is not None
                                             and any(not s.is_finished for s in self._unread.seqs))

    @torch.inference_mode()
    def step(self, compiled: list[str] | None = None) -> list[RequestOutput]:
        """Run one step. With overlap scheduling it returns the previous step's tokens, read back
        while this step's forward runs on the GPU. `compiled`: the guided requests to queue now,
        given by rank 0 to the other tensor-parallel ranks (which wait for their own compiles),
        so that every rank queues them at the same step; None: those whose grammars are ready."""
        if compiled is None:
            compiled = [rid for rid, grammar in self._compiling.items() if grammar.done()]
        self._repeat("step", compiled)
        outputs = self._queue_compiled(compiled)
        if self._unread is not None and any(s.params.matches_output_on_host and not s.is_finished
                                            for s in self._unread.seqs):
            # this step's bans depend on those tokens' values (bad words of several tokens)
            outputs = self._read_back(self._take_unread())
        chunks = self.scheduler.schedule()
        if not chunks:
            if self._compiling:  # nothing to run until a grammar is ready: wait for one, briefly
                wait(self._compiling.values(), timeout=0.01, return_when=FIRST_COMPLETED)
            return outputs + self._read_back(self._take_unread())
        batch = self._forward_batch(chunks)
        if self.graphs is not None and self.graphs.serves(batch):
            out = self.graphs.forward(batch)
        else:
            out = self.model(batch, self.cache)
        if any(c.seq.prompt_logprobs_left for c in chunks):
            self._take_prompt_logprobs(chunks, out.hidden)
        for chunk in chunks:
            chunk.seq.num_computed += chunk.num_tokens
        if self.spec is not None:
            return self._speculative_step(self._with_read_drafts(chunks), batch, out)
        if any(c.seq.matcher is not None and c.seq.pending_rows for c in chunks):
            # A guide's bitmask follows every token before it. The forward needs none of them on
            # the host, so they are read back now, while it runs, not before it was launched.
            outputs += self._read_back(self._take_unread())
        sampled = self._sample(chunks, out)
        previous, self._unread = self._unread, sampled
        outputs += self._read_back(previous)
        if not self.overlap:
            outputs += self._read_back(self._take_unread())
        return outputs

    def _queue_compiled(self, request_ids: list[str]) -> list[RequestOutput]:
        """Queue guided requests with their compiled grammars; a guide that did not compile ends
        its request with finish_reason "error" and the compiler's message."""
        outputs = []
        for rid in request_ids:
            seq = self.sequences[rid]
            try:
                seq.matcher = self._compiling.pop(rid).result()
            except ValueError as e:
                seq.error = str(e)
                self.scheduler.finish(seq, "error")
                del self.sequences[rid]
                outputs.append(self._output(seq, [], []))
            else:
                self.scheduler.add(seq)
        return outputs

    def _sample(self, chunks: list[ScheduledChunk], out: ForwardOutput) -> _SampledStep | None:
        """Sample every request whose chunk reached its last token; nothing waits for the GPU."""
        done = [i for i, chunk in enumerate(chunks) if chunk.completes]
        if not done:
            return None
        seqs = [chunks[i].seq for i in done]
        # Penalties and min_tokens see the tokens not yet read back too (SamplingRow), named as
        # in Sequence.token_ids.
        unread = [s.params.reads_output and bool(s.pending_rows) for s in seqs]
        rows = [SamplingRow(s.params, s.prompt_ids, s.output_so_far(), s.generator, s.arrival) for s in seqs]
        # a guided request's earlier tokens are read back by now (step): none pending
        guides = self.grammars.token_bitmask([(s.matcher, ()) if s.matcher else None for s in seqs])
        sampling = SamplingBatch.build(rows, self.config.vocab_size, self.config.eos_token_ids, self.device,
                                       pending=self._unread.token_ids if any(unread) else None,
                                       counts=self.token_counts, token_bitmask=guides)
        logits = out.logits if len(done) == len(chunks) else out.logits[to_device(torch.tensor(done), self.device)]
        sampled = sample(logits, sampling, self.generator)
        for row, seq in enumerate(seqs):
            seq.pending_rows.append(row)
        return _SampledStep(seqs, sampled.token_ids, HostCopy(sampled.token_ids, *(sampled.logprobs or _NO_LOGPROBS)))

    def _take_prompt_logprobs(self, chunks: list[ScheduledChunk], hidden: torch.Tensor) -> None:
        """The logprob of each prompt token a chunk's positions predict, for the requests that ask
        (SamplingParams.prompt_logprobs): position p gives token p + 1's. Positions computed again
        after a retraction are not taken twice."""
        row = 0
        for chunk in chunks:
            seq = chunk.seq
            start = max(chunk.start, seq.num_prompt_logprobs)
            end = min(chunk.start + chunk.num_tokens, len(seq.prompt_ids) - 1)
            if seq.params.prompt_logprobs and start < end:
                targets = to_device(torch.tensor(seq.prompt_ids[start + 1: end + 1]), self.device)
                rows = hidden[row + start - chunk.start: row + end - chunk.start]
                seq.prompt_logprob_parts.append(HostCopy(self.model.head_logprobs(rows, targets)))
                seq.num_prompt_logprobs = end
            row += chunk.num_tokens + chunk.num_drafts

    def _take_unread(self) -> _SampledStep | None:
        unread, self._unread = self._unread, None
        return unread

    def _read_back(self, sampled: _SampledStep | None) -> list[RequestOutput]:
        """Append a step's tokens to their requests and check stops. A request that ended since
        (aborted, or stopped by its token before) has its token dropped."""
        if sampled is None:
            return []
        tokens, *logprobs = sampled.host.wait()
        outputs = []
        for row, (seq, token) in enumerate(zip(sampled.seqs, tokens)):
            if not seq.is_finished:
                seq.pending_rows.pop(0)
                outputs.append(self._append(seq, [token], [logprobs_at(seq.params, logprobs, row)]))
        return outputs

    def _speculative_step(self, chunks: list[ScheduledChunk], batch: ForwardBatch,
                          out: ForwardOutput) -> list[RequestOutput]:
        """Accept drafts against the target (a plain sample where there were none), move the
        accepted path's KV to the front of the draft region, then draft anew."""
        rows, guides, logit_rows, first_row, row = [], [], [], {}, 0
        for i, chunk in enumerate(chunks):
            tree = chunk.draft or ROOT_ONLY
            if chunk.completes:
                first_row[i] = len(logit_rows)
                seq = chunk.seq
                for node in range(tree.num_nodes):
                    # A node is judged as if its path were already output (penalties, min_tokens,
                    # bad words); only rows that read the output need the path.
                    output = seq.output_so_far(tree.path_tokens(node) if seq.params.reads_output else ())
                    rows.append(SamplingRow(seq.params, seq.prompt_ids, output, seq.generator, seq.arrival))
                    guides.append((seq.matcher, tree.path_tokens(node)) if seq.matcher else None)
                    logit_rows.append(row + node)
            row += tree.num_nodes
        if not rows:
            self._draft(chunks, batch, out, {}, completed=set())
            return []
        sampling = SamplingBatch.build(rows, self.config.vocab_size, self.config.eos_token_ids, self.device,
                                       counts=self.token_counts,
                                       token_bitmask=self.grammars.token_bitmask(guides))
        # every row, when every chunk completes: no gather of [rows, vocab]
        logits = out.logits if len(logit_rows) == out.logits.shape[0] else out.logits[logit_rows]
        processed = process_logits(logits, sampling)
        if self._judges_on_gpu(batch):
            return self._judge_chains_on_gpu(chunks, batch, out, processed, sampling)
        # Here greedy requests walk their trees on the host from one argmax transfer; sampled ones
        # are judged on the device, all at once, and read back once.
        trees = {i: chunks[i].draft or ROOT_ONLY for i in first_row}
        sampled = [i for i in first_row if not chunks[i].seq.params.greedy]
        verdicts = dict(zip(sampled, judge_trees_now(
            sampling_probs(processed, sampling), [trees[i] for i in sampled], [first_row[i] for i in sampled],
            [chunks[i].seq.generator for i in sampled], self.generator))) if sampled else {}
        argmax = processed.argmax(dim=-1).tolist() if sampling.any_greedy else None
        decided = {i: verdicts[i] if i in verdicts else accept_greedy(argmax[r:r + trees[i].num_nodes], trees[i])
                   for i, r in first_row.items()}
        logprobs = self._emitted_logprobs(processed, first_row, decided, sampling, chunks)
        outputs = []
        for i, (path, tokens) in decided.items():
            compact_accepted_path(self.cache, batch, i, chunks[i].start, path)
            outputs.append(self._take_accepted(chunks[i], path, tokens, logprobs[i]))
        self._draft(chunks, batch, out, {i: path for i, (path, _) in decided.items()}, completed=set(first_row))
        return outputs

    def _judges_on_gpu(self, batch: ForwardBatch) -> bool:
        """Whether a verify is judged on the GPU, the next drafting launched behind it: a batch of
        chains, each of every draft."""
        return (self.spec.is_chain and batch.mode == ForwardMode.TARGET_VERIFY
                and batch.num_tokens == batch.batch_size * self.spec.num_draft_tokens)

    def _judge_chains_on_gpu(self, chunks: list[ScheduledChunk], batch: ForwardBatch, out: ForwardOutput,
                             processed: torch.Tensor, sampling: SamplingBatch) -> list[RequestOutput]:
        """Judge every chain on the GPU (spec/acceptance.judge_chains; greedy ones by argmax alone)
        and launch the next drafts before the host reads the verdicts, so the host's outputs,
        stop checks and the next verify's build run while the GPU drafts."""
        n = self.spec.num_draft_tokens
        drafts = batch.input_ids.view(-1, n)[:, 1:]
        if sampling.all_greedy:
            tokens = processed.argmax(dim=-1).view(-1, n)            # the target's choice after each node
            accepted = (drafts == tokens[:, :-1]).int().cumprod(dim=1).sum(dim=1)
        else:
            # greedy rows' verdicts do not depend on their draws: they take the batch's shared ones
            generators = [None if c.seq.params.greedy else c.seq.generator for c in chunks]
            draws = draw_for_judging(len(chunks), (n - 1,), self.config.vocab_size, generators, self.generator,
                                     self.device)
            probs = sampling_probs(processed, sampling).view(len(chunks), n, -1)
            accepted, tokens = judge_chains(probs, drafts, *draws)
        tokens = tokens.flatten()
        logprobs = token_logprobs(processed, tokens, sampling.top_logprobs) if sampling.return_logprobs else None
        host = HostCopy(accepted, tokens, *(logprobs or _NO_LOGPROBS))
        seqs = [chunk.seq for chunk in chunks]
        # pages for the most a verify accepts and the drafts after it
        wants = [self.scheduler.reserve(seq, seq.num_computed + self.spec.num_steps + self.spec.lookahead)
                 for seq in seqs]
        unread = self.drafter.draft_verified_chains(seqs, [c.start for c in chunks], out, tokens, accepted)
        accepted, tokens, *logprobs = host.wait()
        outputs = []
        for i, chunk in enumerate(chunks):
            emitted = range(i * n, i * n + accepted[i] + 1)
            outputs.append(self._take_accepted(chunk, list(range(1, accepted[i] + 1)), tokens[emitted.start:emitted.stop],
                                               [logprobs_at(chunk.seq.params, logprobs, r) for r in emitted]))
            chunk.seq.draft = None
            if wants[i] and not chunk.seq.is_finished:
                unread.hand_to(chunk.seq, i)
        self._unread_drafts = unread
        return outputs

    def _take_accepted(self, chunk: ScheduledChunk, path: list[int], tokens: list[int],
                       logprobs: list[Logprob | None]) -> RequestOutput:
        """Keep the accepted drafts' KV (in place behind the root by now) and emit the tokens."""
        seq = chunk.seq
        seq.num_computed += len(path)
        seq.num_draft_tokens += (chunk.draft or ROOT_ONLY).num_drafts
        seq.num_accepted_draft_tokens += len(path)
        return self._append(seq, tokens, logprobs)

    @staticmethod
    def _emitted_logprobs(processed: torch.Tensor, first_row: dict[int, int],
                          decided: dict[int, tuple[list[int], list[int]]], sampling: SamplingBatch,
                          chunks: list[ScheduledChunk]) -> dict[int, list]:
        """Each emitted token's logprob under its node's target row, in one gather (None for every
        token when no request asked for logprobs)."""
        if not sampling.return_logprobs:
            return {i: [None] * len(tokens) for i, (_, tokens) in decided.items()}
        at = [(first_row[i] + node, t) for i, (path, tokens) in decided.items() for node, t in zip([0] + path, tokens)]
        rows = torch.tensor([r for r, _ in at], device=processed.device)
        picked = token_logprobs(processed[rows], torch.tensor([t for _, t in at], device=processed.device),
                                sampling.top_logprobs)
        host = HostCopy(*picked).wait()
        row = itertools.count()
        return {i: [logprobs_at(chunks[i].seq.params, host, next(row)) for _ in tokens]
                for i, (_, tokens) in decided.items()}

    def _with_read_drafts(self, chunks: list[ScheduledChunk]) -> list[ScheduledChunk]:
        """The chunks with their drafts' token ids on the host, once the verify step that takes
        them from the GPU is launched (the draft step before it is done by then, or nearly)."""
        if self._unread_drafts is None:
            return chunks
        self._unread_drafts.read()
        self._unread_drafts = None
        return [replace(c, draft=c.seq.draft) if c.draft else c for c in chunks]

    def _draft(self, chunks: list[ScheduledChunk], batch: ForwardBatch, out: ForwardOutput,
               accepted: dict[int, list[int]], completed: set[int]) -> None:
        offsets = batch.token_offsets
        items = []
        for i, chunk in enumerate(chunks):
            seq = chunk.seq
            seq.draft = None
            if seq.is_finished:
                continue
            # The MTP layer covers the positions whose KV the target kept, one token ahead: the
            # root and the accepted path (compacted behind it), or the chunk's tokens.
            if chunk.draft:
                rows = [offsets[i] + node for node in [0] + accepted[i]]
            else:
                rows = list(range(offsets[i], offsets[i] + chunk.num_tokens))
            wants = i in completed and self.scheduler.reserve(seq, seq.num_computed + self.spec.lookahead)
            items.append(DraftInput(seq, chunk.start, seq.token_ids(chunk.start + 1, chunk.start + len(rows) + 1),
                                    rows, wants))
        self._unread_drafts = self.drafter.draft(items, out)

    def _forward_batch(self, chunks: list[ScheduledChunk]) -> ForwardBatch:
        # A chunk with drafts is one token, the request's last (the scheduler drops drafts
        # otherwise): the tree's root, the drafts its nodes.
        if all(c.draft and c.num_tokens == 1 for c in chunks):
            mode = ForwardMode.TARGET_VERIFY
        elif all(c.num_tokens == 1 and c.start > 0 and not c.draft for c in chunks):
            mode = ForwardMode.DECODE
        else:
            mode = ForwardMode.EXTEND
        batch = ForwardBatch.build(
            mode, [c.seq.token_ids(c.start, c.start + c.num_tokens) + list(c.draft.tokens if c.draft else ())
                   for c in chunks],
            [c.start for c in chunks], [c.seq.pages for c in chunks], self.args.page_size, self.device,
            all_logits=[bool(c.draft) for c in chunks],
            trees=[c.draft.layout() if c.draft else None for c in chunks])
        if any(c.seq.pending_rows for c in chunks):
            batch.input_ids = with_pending_tokens(batch.input_ids, self._unread.token_ids)
        elif any(c.draft and c.draft.unread for c in chunks):
            batch.input_ids = with_pending_tokens(batch.input_ids, self._unread_drafts.token_ids)
        return batch

    def _append(self, seq: Sequence, tokens: list[int], logprobs: list[Logprob | None]) -> RequestOutput:
        """Append tokens in order until one stops the request."""
        new, new_logprobs = [], []
        for token, logprob in zip(tokens, logprobs):
            seq.output_ids.append(token)
            new.append(token)
            if logprob is not None:
                seq.output_logprobs.append(logprob.value)
                new_logprobs.append(logprob)
            reason = self._stop_reason(seq, token)
            if seq.matcher is not None and not seq.matcher.accept_token(token):
                # the guide's tokens were all banned (bad words): nothing it allows could be sampled
                reason, seq.error = "error", (f"guided decoding: token {token} breaks the guide; every token it "
                                              "allowed there was banned (bad_words)")
            if reason is not None:
                self.scheduler.finish(seq, reason)
                del self.sequences[seq.request_id]
                break
        return self._output(seq, new, new_logprobs)

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        n = len(seq.output_ids)
        if n >= p.min_tokens:
            if token in p.stop_token_ids or (token in self.config.eos_token_ids and not p.ignore_eos):
                return "stop"
        if n >= p.max_tokens or len(seq.prompt_ids) + n >= self.max_model_len:
            return "length"
        return None

    def _output(self, seq: Sequence, new_ids: list[int], new_logprobs: list[Logprob]) -> RequestOutput:
        want = seq.params.logprobs
        prompt_logprobs = None
        if seq.params.prompt_logprobs and new_ids and len(new_ids) == len(seq.output_ids):  # the first tokens
            prompt_logprobs = [None] + [lp for part in seq.prompt_logprob_parts for lp in part.wait()[0]]
            seq.prompt_logprob_parts = []
        return RequestOutput(
            request_id=seq.request_id, new_token_ids=new_ids,
            new_logprobs=[lp.value for lp in new_logprobs] if want else None,
            new_top_logprobs=[lp.top for lp in new_logprobs] if seq.params.top_logprobs else None,
            cumulative_logprob=sum(seq.output_logprobs) if want else None,
            finished=seq.is_finished, finish_reason=seq.finish_reason,
            num_prompt_tokens=len(seq.prompt_ids), num_output_tokens=len(seq.output_ids),
            num_draft_tokens=seq.num_draft_tokens, num_accepted_draft_tokens=seq.num_accepted_draft_tokens,
            num_cached_tokens=seq.num_cached_tokens or 0, error=seq.error, prompt_logprobs=prompt_logprobs)

    def stats(self) -> dict[str, float]:
        pages = self.scheduler.pages
        return {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting) + len(self._compiling),
                # cached pages no request holds are free: an allocation evicts them
                "kv_pages_total": pages.allocator.num_pages - self.num_held_pages, "kv_pages_free": pages.num_available,
                "kv_pages_cached": pages.num_cached, "prefix_cache_hit_tokens": self.scheduler.num_cached_tokens,
                "retractions": self.scheduler.num_retractions, **self._kernel_load_stats()}

    def _kernel_load_stats(self) -> dict[str, float]:
        """Kernels Triton loaded (compiled or read from its disk cache) since the engine was ready."""
        if self.kernel_loads is None:
            return {"kernel_loads": 0, "kernel_load_seconds": 0.0}
        count, seconds = self._loads_before_ready
        return {"kernel_loads": self.kernel_loads.count - count,
                "kernel_load_seconds": self.kernel_loads.seconds - seconds}
