"""EXTEND batches through the kernel backend's indexer top-k: one ragged call of every request's keys
(the code before the pieces, extend_logits_bytes unbounded) against calls within 256 MiB of logits.
Peak memory above what was allocated before the call, CUDA-event time (median of 5 after a warm-up),
and the top-k compared bit for bit. With DeepGEMM (auto) and with ours alone."""
import json, os, statistics, sys
import torch
import dsa_kernels
from dsa_kernels import dispatch
from dsa_backend.attention import KernelDsaBackend, EXTEND_LOGITS_BYTES
from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.cache.pools import IndexerKeyPool

PAGE, TOPK, HEADS = 64, 2048, 64
dev = torch.device("cuda")
SCENARIOS = {  # name -> [(prefix, new tokens)] per request
    "63 decodes at 32K + a 2048 chunk to 32K": [(32767, 1)] * 63 + [(30720, 2048)],
    "a 2048 chunk to 128K": [(129024, 2048)],
    "31 decodes at 2112 + a 2048 chunk from 0": [(2111, 1)] * 31 + [(0, 2048)],
    "a 2048 chunk from 0": [(0, 2048)],
    "8 decodes at 16K + a 2048 chunk to 16K": [(16383, 1)] * 8 + [(14336, 2048)],
}
need = max(sum(-(-(p + n) // PAGE) for p, n in reqs) for reqs in SCENARIOS.values())
pool = IndexerKeyPool((0,), need, PAGE, 128, torch.bfloat16, fp8=True, device=dev)
gen = torch.Generator(device=dev).manual_seed(0)
for s in range(0, need * PAGE, 1 << 18):
    slots = torch.arange(s, min(need * PAGE, s + (1 << 18)), device=dev)
    pool.store(0, slots, torch.randn(len(slots), 128, device=dev, generator=gen))
torch.cuda.synchronize()

def batch_of(reqs):
    pages, nxt = [], 0
    for p, n in reqs:
        k = -(-(p + n) // PAGE)
        pages.append(list(range(nxt, nxt + k)))
        nxt += k
    return ForwardBatch.build(ForwardMode.EXTEND, [[1] * n for _, n in reqs], [p for p, _ in reqs], pages, PAGE, dev)

def measure(backend, q, w, batch):
    out = backend.indexer_topk(q, w, pool, 0, batch, TOPK, 128 ** -0.5)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); backend.indexer_topk(q, w, pool, 0, batch, TOPK, 128 ** -0.5); b.record()
        torch.cuda.synchronize(); times.append(a.elapsed_time(b))
    return out, statistics.median(times), (torch.cuda.max_memory_allocated() - base) / 2**20

results = []
orig_library = dispatch._library
for libs in os.environ.get("LIBS", "auto,ours").split(","):
    dispatch._library = orig_library if libs == "auto" else (lambda name: None if name == "deep_gemm" else orig_library(name))
    for name, reqs in SCENARIOS.items():
        batch = batch_of(reqs)
        q = torch.randn(batch.num_tokens, HEADS, 128, device=dev, generator=gen).bfloat16()
        w = torch.randn(batch.num_tokens, HEADS, device=dev, generator=gen)
        row = dict(scenario=name, libs=libs, rows=batch.num_tokens, keys=sum(p + n for p, n in reqs))
        try:
            one, t1, m1 = measure(KernelDsaBackend(extend_logits_bytes=1 << 62), q, w, batch)
            row.update(one_call_ms=round(t1, 3), one_call_peak_mib=round(m1))
        except torch.OutOfMemoryError as exc:
            one = None
            row.update(one_call_error=str(exc).split("\n")[0][:160])
        torch.cuda.empty_cache()
        got, t2, m2 = measure(KernelDsaBackend(), q, w, batch)
        row.update(pieces_ms=round(t2, 3), pieces_peak_mib=round(m2), equal=None if one is None else bool(torch.equal(one, got)))
        if one is not None:
            row["pieces_over_one_call_time"] = round(t2 / t1, 3)
        del one, got
        torch.cuda.empty_cache()
        print(json.dumps(row), flush=True)
        results.append(row)
dispatch._library = orig_library
json.dump(dict(gpu=torch.cuda.get_device_name(), budget_mib=EXTEND_LOGITS_BYTES >> 20, results=results),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "extend_pieces.json"), "w"), indent=1)

# Where the pieces' time goes: each piece's ragged logits and top-k timed alone (auto), and their sum
from dsa_backend.attention import ragged_pieces
from dsa_backend.attention import per_token_context_lens
from dsa_backend.attention import fold_indexer_scales

def timed(fn, reps=5):
    fn(); torch.cuda.synchronize(); ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return round(statistics.median(ts), 3)

breakdown = []
for budget, label in () if os.environ.get("BREAKDOWN") == "0" else ((1 << 62, "one call"), (EXTEND_LOGITS_BYTES, "pieces")):
    for name in ("31 decodes at 2112 + a 2048 chunk from 0", "a 2048 chunk to 128K"):
        batch = batch_of(SCENARIOS[name])
        q = torch.randn(batch.num_tokens, HEADS, 128, device=dev, generator=gen).bfloat16()
        w = torch.randn(batch.num_tokens, HEADS, device=dev, generator=gen)
        q8, w8 = fold_indexer_scales(q, w, True, 128 ** -0.5)
        ctx = per_token_context_lens(batch)
        el, sl = torch.stack([batch.extend_lens, batch.seq_lens]).tolist()
        for piece in ragged_pieces(el, sl, budget // 4):
            r = piece.rows
            lg = lambda: KernelDsaBackend._ragged_logits(q8[r], w8[r], pool.buffer[0], batch, piece)
            logits, starts = lg()
            tk = lambda: dsa_kernels.topk_transform(logits, ctx[r], TOPK, "ragged", row_starts=starts, offsets=torch.zeros_like(starts))
            row = dict(label=label, scenario=name, rows=r.stop - r.start, keys=sum(piece.key_lens),
                       logits_ms=timed(lg), topk_ms=timed(tk))
            print(json.dumps(row), flush=True); breakdown.append(row)
            del logits, starts
json.dump(dict(gpu=torch.cuda.get_device_name(), budget_mib=EXTEND_LOGITS_BYTES >> 20, results=results, breakdown=breakdown),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "extend_pieces.json"), "w"), indent=1)
