"""One device call: correctness checks and timings of the DSA kernels against DeepGEMM, FlashMLA,
torch and the copy / bf16-matmul ceilings, all measured in the same run.

    source .device/setup.sh && python3 benchmarks/bench_kernels.py            # GPU, writes $OUT
    source .device/setup.sh && python3 benchmarks/bench_kernels.py --only topk  # one section (~1 min)
    ... --only ceilings,indexer --index-heads 32                                 # GLM-5's indexer heads
    TRITON_INTERPRET=1 .venv/bin/python benchmarks/bench_kernels.py --smoke   # CPU logic check

Writes results.json and results.md to $OUT (or ./bench_out) after every section, so a run cut
short still returns what it measured. Sections stop starting once --budget seconds are spent.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
try:
    import dsa_kernels  # noqa: F401
except ImportError:  # the device machine sees the repo root, not the installed package mapping
    spec = importlib.util.spec_from_file_location("dsa_kernels", ROOT / "kernels" / "__init__.py",
                                                  submodule_search_locations=[str(ROOT / "kernels")])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["dsa_kernels"] = mod
    spec.loader.exec_module(mod)

from dsa_kernels import dispatch, indexer_logits, reference, sparse_mla, topk  # noqa: E402
from dsa_kernels.device import l2_bytes  # noqa: E402
from indexer_bench import random_index_pool  # noqa: E402

ARGS = argparse.ArgumentParser()
ARGS.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (interpreter), no timing claims")
ARGS.add_argument("--budget", type=float, default=480.0, help="seconds after which no new section starts")
ARGS.add_argument("--only", default="", help="comma list of sections to run: ceilings, correctness, indexer, topk, "
                  "decode, prefill, power (e.g. --only topk)")
ARGS.add_argument("--index-heads", type=int, default=64,
                  help="the indexer's query heads: 64 (DeepSeek-V3.2, the issue's shapes) or 32 (GLM-5)")
OPT = ARGS.parse_args()
DEV = "cpu" if OPT.smoke else "cuda"
T0 = time.time()
OUT = Path(os.environ.get("OUT", ROOT / "bench_out"))
OUT.mkdir(parents=True, exist_ok=True)
RES: dict = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "index_heads": OPT.index_heads,
             "rows": [], "checks": [], "errors": []}
K = 64 if OPT.smoke else 2048
PAGE = 64 if not OPT.smoke else 16
NUM_SMS = 132 if OPT.smoke else torch.cuda.get_device_properties(0).multi_processor_count


def bench(fn) -> float:
    """Median milliseconds."""
    if OPT.smoke:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median"))


def bench_graph(fn) -> float | None:
    """Median milliseconds of fn replayed as a CUDA graph: device time without Python launch
    overhead, which at small batches exceeds the kernels themselves (what an engine replaying
    graphs pays). None when fn cannot be captured."""
    if OPT.smoke:
        return None
    from graph_timing import graph_ms

    try:
        return round(graph_ms(fn), 5)
    except Exception as exc:  # noqa: BLE001 - e.g. a library call that synchronises
        RES["errors"].append(f"graph capture: {str(exc)[:160]}")
        return None


def row(section, name, ms, **kw):
    r = dict(section=section, name=name, ms=None if ms is None else round(ms, 5), **kw)
    RES["rows"].append(r)
    print(json.dumps(r), flush=True)


def check(name, ok, **kw):
    RES["checks"].append(dict(name=name, ok=bool(ok), **kw))
    print("CHECK", name, ok, kw, flush=True)


def save():
    (OUT / "results.json").write_text(json.dumps(RES, indent=1))
    lines = [f"# kernel benchmarks {RES['date']} on {RES.get('gpu', DEV)}", "",
             "| section | name | ms | metrics |", "| --- | --- | --- | --- |"]
    for r in RES["rows"]:
        extra = ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("section", "name", "ms"))
        lines.append(f"| {r['section']} | {r['name']} | {r['ms']} | {extra} |")
    lines += ["", "| check | ok | detail |", "| --- | --- | --- |"]
    for c in RES["checks"]:
        lines.append(f"| {c['name']} | {c['ok']} | {', '.join(f'{k}={v}' for k, v in c.items() if k not in ('name', 'ok'))} |")
    lines += ["", "errors:"] + [f"- {e}" for e in RES["errors"]]
    (OUT / "results.md").write_text("\n".join(lines))


def section(name):
    def wrap(fn):
        def run():
            if OPT.only and name not in OPT.only.split(","):
                return
            if time.time() - T0 > OPT.budget:
                RES["errors"].append(f"{name}: skipped, budget spent")
                return
            t = time.time()
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - record and go on to the next section
                RES["errors"].append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
                traceback.print_exc()
            RES.setdefault("section_s", {})[name] = round(time.time() - t, 1)
            if DEV == "cuda":
                torch.cuda.empty_cache()
            save()
        return run
    return wrap


def lib(name):
    return None if OPT.smoke else dispatch._library(name)


# ---------------------------------------------------------------- inputs


def paged_case(batch, ctx, next_n, pool):
    pages_per = math.ceil(ctx / PAGE)
    table = torch.randperm(pool.shape[0], device=DEV)[: batch * pages_per].view(batch, pages_per).int()
    seq = torch.full((batch,), ctx, device=DEV)
    lens = torch.stack([seq - next_n + j + 1 for j in range(next_n)], 1).reshape(-1).int()
    q = torch.randn(batch * next_n, OPT.index_heads, 128, device=DEV).to(torch.float8_e4m3fn)
    w = torch.randn(batch * next_n, OPT.index_heads, device=DEV) * 0.1
    return q, w, table, lens


def from_hbm(call, table, key_bytes, pool):
    """call(table) made to read its keys from HBM under graph replay: successive calls rotate over
    block tables of pages of their own, enough that one rotation's keys are three times L2. In an
    engine each layer reads its own keys, so a layer's keys are not in L2 when its indexer runs;
    one table replayed would find grids of up to ~L2 of keys there. None where the pool is too small."""
    rotation = max(2, math.ceil(3 * l2_bytes(pool.device) / key_bytes))
    if rotation * table.numel() > pool.shape[0]:
        return None
    tables = torch.randperm(pool.shape[0], device=DEV)[: rotation * table.numel()].view(rotation, *table.shape).int()
    turns = itertools.cycle(list(tables))
    return lambda: call(next(turns))


# ---------------------------------------------------------------- sections


@section("ceilings")
def ceilings():
    measure_ceilings()


def measure_ceilings():
    if OPT.smoke:
        RES["copy_GBps"], RES["matmul_TFLOPs"], RES["fp8_matmul_TFLOPs"] = 1.0, 1.0, 1.0
        return
    RES["gpu"] = torch.cuda.get_device_name(0)
    x = torch.randn(1 << 29, device=DEV)  # 2 GiB
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    RES["copy_GBps"] = 2 * x.numel() * 4 / ms / 1e6
    row("ceiling", "copy 2 GiB d2d", ms, GBps=round(RES["copy_GBps"]))
    del x, y
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    ms = bench(lambda: a @ b)
    RES["matmul_TFLOPs"] = 2 * 8192**3 / ms / 1e9
    row("ceiling", "bf16 matmul 8192^3", ms, TFLOPs=round(RES["matmul_TFLOPs"]))
    # the indexer's tensor-core work is e4m3 (64 heads x 128 dims per key and query token): its floor
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    one = torch.ones((), device=DEV)
    ms = bench(lambda: torch._scaled_mm(a8, b8.t(), one, one, out_dtype=torch.bfloat16))
    RES["fp8_matmul_TFLOPs"] = 2 * 8192**3 / ms / 1e9
    row("ceiling", "e4m3 matmul 8192^3 (torch._scaled_mm)", ms, TFLOPs=round(RES["fp8_matmul_TFLOPs"]))


@section("correctness")
def correctness():
    # stores: bit-exact against the references on the GPU's own arithmetic
    pool = random_index_pool(64, PAGE, DEV)
    keys = torch.randn(1000, 128, device=DEV) * 4
    slots = torch.randperm(64 * PAGE, device=DEV)[:1000]
    # References run on the CPU: PyTorch's CUDA `tensor / python_scalar` multiplies by the
    # reciprocal, so amax / 448 itself differs by an ulp there; the CPU divides like IEEE (and
    # like the kernel's div_rn).
    for rotate in (False, True):
        a, b = pool.clone(), pool.cpu()
        dispatch.store_index_keys(a, keys, slots, PAGE, rotate=rotate, backend="triton")
        reference.store_index_keys_ref(b, keys.cpu(), slots.cpu(), PAGE, rotate=rotate)
        bad = int((a.cpu() != b).sum())
        # rotating is a matmul whose fp32 summation order differs: a rare value lands on the other
        # side of an e4m3 rounding boundary, so only the unrotated store must be bit-exact (the
        # interpreter's matmul moves a token's amax, and so all its bytes, more often: 1% there,
        # as in tests/kernels/test_cache_store.py)
        share = 1e-2 if OPT.smoke else 1e-4
        check(f"index store bytes rotate={rotate}", bad == 0 if not rotate else bad <= a.numel() * share,
              mismatched_bytes=bad)
    for fp8 in (False, True):
        p = torch.zeros(2000, 656 if fp8 else 576, dtype=torch.uint8 if fp8 else torch.bfloat16, device=DEV)
        lat, rope, sl = torch.randn(1000, 512, device=DEV), torch.randn(1000, 64, device=DEV), torch.randperm(2000, device=DEV)[:1000]
        a, b = p.clone(), p.cpu()
        dispatch.store_mla_kv(a, lat, rope, sl, backend="triton")
        reference.store_mla_ref(b, lat.cpu(), rope.cpu(), sl.cpu())
        check(f"mla store bytes fp8={fp8} (vs CPU reference)", torch.equal(a.cpu().view(torch.uint8), b.view(torch.uint8)),
              mismatched_bytes=int((a.cpu().view(torch.uint8) != b.view(torch.uint8)).sum()))
    # paged logits and the end-to-end top-k overlap against the fp32 reference
    ctx = 600 if OPT.smoke else 9000
    pool = random_index_pool(8 * math.ceil(ctx / PAGE) + 8, PAGE, DEV)
    for next_n in (1, 2, 4):
        q, w, table, lens = paged_case(4, ctx, next_n, pool)
        out = indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, ctx, next_n)
        want = reference.paged_indexer_logits_ref(q, w, pool, table, lens, PAGE, ctx, next_n)
        fin = torch.isfinite(want)
        err = float(((out - want)[fin]).abs().max() / want[fin].abs().max())
        same_mask = torch.equal(fin, torch.isfinite(out))
        got = topk.topk_transform(out, lens, K)
        ref_pos = reference.topk_positions_ref(want, lens, K)
        overlap = min(len(set(got[i].tolist()) & set(ref_pos[i].tolist())) / K for i in range(got.shape[0]))
        exact = torch.equal(got, reference.topk_positions_ref(out, lens, K))
        check(f"paged logits next_n={next_n}", same_mask and err < 1e-3 and overlap >= 0.99 and exact,
              max_rel_err=err, topk_overlap_min=overlap, topk_exact_on_own_logits=exact)
        if lib("deep_gemm") is not None:
            try:
                dg = dispatch._deepgemm_paged(q, w, pool, table, lens, PAGE, ctx, next_n, True)
                err = float(((dg - want)[fin]).abs().max() / want[fin].abs().max())
                check(f"deepgemm paged next_n={next_n} vs reference", err < 1e-3, max_rel_err=err)
            except Exception as exc:  # noqa: BLE001
                check(f"deepgemm paged next_n={next_n}", False, error=str(exc)[:200])
    # sparse MLA against the fp32 reference
    slots_total = 4096 if OPT.smoke else 65536
    for fp8 in (False, True):
        p = torch.zeros(slots_total, 656 if fp8 else 576, dtype=torch.uint8 if fp8 else torch.bfloat16, device=DEV)
        dispatch.store_mla_kv(p, torch.randn(slots_total, 512, device=DEV), torch.randn(slots_total, 64, device=DEV),
                              torch.arange(slots_total, device=DEV))
        for heads in (64, 128):
            n = 2 if OPT.smoke else 8
            q = torch.randn(n, heads, 576, device=DEV).to(torch.bfloat16)
            idx = torch.randint(0, slots_total, (n, K), device=DEV).int()
            idx[0, K // 2:] = -1
            want, _ = reference.sparse_mla_ref(q, p, idx, 576**-0.5, chunk=2)
            out, _ = sparse_mla.sparse_mla(q, p, idx, 576**-0.5)
            err = float((out.float() - want).norm() / want.norm())
            check(f"sparse mla fp8={fp8} heads={heads}", err < (1e-2 if fp8 else 5e-3), rel_err=err)
            if fp8 and lib("flash_mla") is not None:
                try:
                    fo, _ = dispatch._flashmla_decode(q, p, idx, 576**-0.5)
                    ferr = float((fo.float() - want).norm() / want.norm())
                    check(f"flashmla decode heads={heads} vs reference", ferr < 1e-2, rel_err=ferr)
                except Exception as exc:  # noqa: BLE001
                    check(f"flashmla decode heads={heads}", False, error=str(exc)[:200])


PAGED_CONFIGS = [
    dict(BLOCK_K=64, KEYS_PER_PROG=1024, num_warps=4, num_stages=3),
    dict(BLOCK_K=64, KEYS_PER_PROG=512, num_warps=4, num_stages=4),
    dict(BLOCK_K=128, KEYS_PER_PROG=1024, num_warps=8, num_stages=3),
    dict(BLOCK_K=128, KEYS_PER_PROG=2048, num_warps=8, num_stages=4),
]


@section("indexer")
def indexer():
    if "copy_GBps" not in RES:  # its rows are fractions of the ceilings (--only indexer)
        measure_ceilings()
    batches, ctxs = ([1, 4], [256, 1024]) if OPT.smoke else ([1, 32, 128], [4096, 32768, 131072])
    max_tokens = max(batches) * max(ctxs)
    pool = random_index_pool(max_tokens // PAGE + 64, PAGE, DEV)
    dg = lib("deep_gemm")
    best_cfg = {}
    for ctx in ctxs:
        for batch in batches:
            for next_n in (1, 2, 4):
                if time.time() - T0 > OPT.budget * 0.55:
                    RES["errors"].append(f"indexer: stopped before batch={batch} ctx={ctx}")
                    return
                q, w, table, lens = paged_case(batch, ctx, next_n, pool)
                key_bytes = batch * ctx * 132
                tag = dict(batch=batch, ctx=ctx, next_n=next_n)
                sweep = batch == 128 and ctx == 32768 and not OPT.smoke
                if sweep:
                    cfgs = list(PAGED_CONFIGS)
                    cfgs += [dict(c, num_warps=8) for c in PAGED_CONFIGS[:2]] if next_n > 1 else []
                else:
                    cfgs = [best_cfg.get(next_n)]
                times = []
                for cfg in cfgs:
                    ms = bench(lambda: indexer_logits.paged_indexer_logits(
                        q, w, pool, table, lens, PAGE, ctx, next_n, clean_logits=False, config=cfg))
                    times.append((ms, cfg))
                ms, cfg = min(times, key=lambda t: t[0])
                if sweep:
                    best_cfg[next_n] = cfg
                    RES.setdefault("paged_sweep", []).append(dict(tag, times=[(round(t, 4), c) for t, c in times]))
                gbps = key_bytes / ms / 1e6
                row("indexer", "triton paged", ms, **tag, GBps=round(gbps), copy_frac=round(gbps / RES["copy_GBps"], 3),
                    cfg=str(cfg))
                # the default path (no config): Gluon on Hopper, key chunks sized to the grid
                g_ours = bench_graph(lambda: indexer_logits.paged_indexer_logits(
                    q, w, pool, table, lens, PAGE, ctx, next_n, clean_logits=False))
                gluon = indexer_logits.gluon_paged_config(q.device, batch, ctx, next_n, PAGE) is not None
                # neither bound can be beaten: reading the keys once, and the e4m3 products at the matmul ceiling
                floor_ms = max(key_bytes / RES["copy_GBps"] / 1e6,
                               2 * OPT.index_heads * 128 * next_n * batch * ctx / RES["fp8_matmul_TFLOPs"] / 1e9)
                row("indexer", "default paged, CUDA graph", g_ours, **tag, kernel="gluon" if gluon else "triton",
                    copy_frac=round(key_bytes / g_ours / 1e6 / RES["copy_GBps"], 3) if g_ours else None,
                    floor_ms=round(floor_ms, 4))
                g_dg = None
                if dg is not None:
                    try:
                        def dg_fn():
                            return dispatch._deepgemm_paged(q, w, pool, table, lens, PAGE, ctx, next_n, False)

                        ms_dg, g_dg = bench(dg_fn), bench_graph(dg_fn)
                        row("indexer", "deepgemm paged", ms_dg, **tag, GBps=round(key_bytes / ms_dg / 1e6),
                            ours_over_dg_speed=round(ms_dg / ms, 3), graph_ms=g_dg,
                            default_over_dg_speed_graph=round(g_dg / g_ours, 3) if g_dg and g_ours else None)
                    except Exception as exc:  # noqa: BLE001
                        RES["errors"].append(f"deepgemm paged {tag}: {str(exc)[:200]}")
                # a replayed graph would find these keys in L2: time them from HBM too
                if not OPT.smoke and key_bytes < 2 * l2_bytes(pool.device):
                    def ours_at(t):
                        return indexer_logits.paged_indexer_logits(q, w, pool, t, lens, PAGE, ctx, next_n,
                                                                   clean_logits=False)

                    def dg_at(t):
                        return dispatch._deepgemm_paged(q, w, pool, t, lens, PAGE, ctx, next_n, False)

                    ours_hbm = from_hbm(ours_at, table, key_bytes, pool)
                    g_hbm = bench_graph(ours_hbm) if ours_hbm else None
                    g_dg_hbm = bench_graph(from_hbm(dg_at, table, key_bytes, pool)) if g_dg and g_hbm else None
                    row("indexer", "default paged, CUDA graph, keys from HBM", g_hbm, **tag,
                        copy_frac=round(key_bytes / g_hbm / 1e6 / RES["copy_GBps"], 3) if g_hbm else None,
                        deepgemm_graph_ms=g_dg_hbm,
                        default_over_dg_speed_graph=round(g_dg_hbm / g_hbm, 3) if g_dg_hbm and g_hbm else None)
                if batch == max(batches) and ctx == ctxs[1]:
                    # torch: the dequantize-and-matmul a framework would do (32 tokens keep it in memory)
                    def torch_path():
                        return reference.paged_indexer_logits_ref(q[:32], w[:32], pool, table, lens[:32], PAGE, ctx, next_n)
                    if not OPT.smoke:
                        row("indexer", "torch reference (first 32 tokens)", bench(torch_path), **tag)
                del q, w, table, lens


def launch_ms(fn, reps: int = 20) -> dict:
    """Mean device time of each kernel fn launches, by kernel name, from the torch profiler."""
    if OPT.smoke:
        return {}
    fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return {e.key[:60]: round(e.device_time_total / 1000 / reps, 4) for e in prof.key_averages()
            if e.device_time_total > 0}


@section("topk")
def topk_section():
    """Top-k + transform at k 2048 next to torch.topk and the indexer that feeds it, all timed here
    (so `--only topk` stands alone); every timed output is checked against the reference."""
    cases = [(4, 256), (1, 1024)] if OPT.smoke else [(1, 32768), (32, 32768), (128, 32768), (1, 131072), (32, 131072), (128, 131072)]
    pool = random_index_pool(max(b * c for b, c in cases) // PAGE + 64, PAGE, DEV)
    dg = lib("deep_gemm")

    def exact(logits, lens, table, got):
        return torch.equal(got, reference.paged_transform_ref(reference.topk_positions_ref(logits, lens, K), table, PAGE))

    for batch, ctx in cases:
        q, w, table, lens = paged_case(batch, ctx, 1, pool)
        tag = dict(batch=batch, ctx=ctx)
        idx_fn = lambda: indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, ctx, 1, clean_logits=False)  # noqa: E731
        ms_idx, g_idx = bench(idx_fn), bench_graph(idx_fn)
        row("topk", "triton paged indexer (next_n 1, default config)", ms_idx, **tag, graph_ms=g_idx)
        ms_dg = g_dg = None
        if dg is not None:
            try:
                dg_fn = lambda: dispatch._deepgemm_paged(q, w, pool, table, lens, PAGE, ctx, 1, False)  # noqa: E731
                ms_dg, g_dg = bench(dg_fn), bench_graph(dg_fn)
                row("topk", "deepgemm paged indexer (next_n 1)", ms_dg, **tag, graph_ms=g_dg)
            except Exception as exc:  # noqa: BLE001
                RES["errors"].append(f"deepgemm paged {tag}: {str(exc)[:200]}")
        for source in ("randn", "indexer"):
            if source == "randn":
                logits = torch.randn(batch, ctx, device=DEV)
            else:  # the indexer's own output: the distribution the sampled threshold sees in serving
                logits = indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, ctx, 1)

            def paged():
                return dispatch.topk_transform(logits, lens, K, "paged", block_table=table, page_size=PAGE, backend="triton")

            ms, g = bench(paged), bench_graph(paged)
            fracs = dict(frac_of_indexer=round(ms / ms_idx, 3), frac_of_deepgemm=round(ms / ms_dg, 3) if ms_dg else None,
                         graph_ms=g, graph_frac_of_indexer=round(g / g_idx, 3) if g and g_idx else None)
            if source == "randn":
                offs = torch.zeros(batch, device=DEV, dtype=torch.int32)
                ms_r = bench(lambda: dispatch.topk_transform(logits, lens, K, "ragged", offsets=offs, backend="triton"))

                def torch_topk():
                    pos = torch.topk(logits, K, dim=1).indices
                    return table.gather(1, pos // PAGE) * PAGE + pos % PAGE

                ms_t = bench(torch_topk)
                row("topk", "torch.topk + gather, CUDA graph", bench_graph(torch_topk) or float("nan"), **tag)
                row("topk", "triton paged transform", ms, **tag, **fracs, vs_torch_speed=round(ms_t / ms, 3))
                row("topk", "triton paged transform, per launch (profiler)", ms, **tag, launches_ms=launch_ms(paged))
                row("topk", "triton ragged transform", ms_r, **tag)
                row("topk", "torch.topk + gather", ms_t, **tag)
            else:
                # in serving the top-k runs right behind the indexer: timed alone, its logits stay
                # in L2 between replays and it looked ~9 us cheaper (docs/PERFORMANCE.md)
                both = bench_graph(lambda: dispatch.topk_transform(idx_fn(), lens, K, "paged", block_table=table,
                                                                   page_size=PAGE, backend="triton"))
                behind = dict(graph_ms_behind_indexer=round(both - g_idx, 5),
                              graph_frac_of_indexer_behind_it=round((both - g_idx) / g_idx, 3)) if both and g_idx else {}
                if g_dg:  # behind DeepGEMM's indexer, which the dispatch runs wherever deep_gemm loads
                    both_dg = bench_graph(lambda: dispatch.topk_transform(dg_fn(), lens, K, "paged", block_table=table,
                                                                          page_size=PAGE, backend="triton"))
                    if both_dg:
                        behind.update(graph_ms_behind_deepgemm=round(both_dg - g_dg, 5),
                                      graph_frac_of_deepgemm_behind_it=round((both_dg - g_dg) / g_dg, 3))
                row("topk", "triton paged transform, indexer logits", ms, **tag, **fracs, **behind)
            check(f"topk exact {source} batch={batch} ctx={ctx}", exact(logits, lens, table, paged()))
        del q, w, table, lens, logits
    # Massive ties overflow the candidate list: the exact whole-row fallback, for its cost.
    batch, ctx = (4, 256) if OPT.smoke else (32, 32768)
    logits = torch.randint(0, 16, (batch, ctx), device=DEV).float()
    lens = torch.full((batch,), ctx, device=DEV, dtype=torch.int32)
    table = torch.arange(batch * ctx // PAGE, device=DEV, dtype=torch.int32).view(batch, -1)
    got = dispatch.topk_transform(logits, lens, K, "paged", block_table=table, page_size=PAGE, backend="triton")
    row("topk", "triton paged transform, 16 distinct values (whole-row fallback)", bench(
        lambda: dispatch.topk_transform(logits, lens, K, "paged", block_table=table, page_size=PAGE, backend="triton")),
        batch=batch, ctx=ctx)
    check(f"topk exact ties batch={batch} ctx={ctx}", exact(logits, lens, table, got))


def mla_times(tag: dict, q, kv, idx, flashmla) -> None:
    """CUDA-graph times of the default sparse MLA path (the Gluon kernel on Hopper), the Triton
    kernel and FlashMLA (when given) on the same inputs; one row, ratios included, and the default
    path's time per launch (the split-K merge took a third of the op at batch 32 unseen until its
    launches were timed apart)."""
    flops = 2 * q.shape[0] * q.shape[1] * idx.shape[1] * (576 + 512)
    kernel = "gluon" if sparse_mla.gluon_runs(q, kv) else "triton"
    ms = bench(lambda: sparse_mla.sparse_mla(q, kv, idx, 576**-0.5))
    g = bench_graph(lambda: sparse_mla.sparse_mla(q, kv, idx, 576**-0.5))
    g_tri = bench_graph(lambda: sparse_mla.sparse_mla(q, kv, idx, 576**-0.5, gluon=False))
    g_fm = None
    if flashmla is not None:
        try:
            g_fm = bench_graph(flashmla)
        except Exception as exc:  # noqa: BLE001
            RES["errors"].append(f"flashmla {tag}: {str(exc)[:200]}")
    row(tag.pop("section"), "sparse mla (default path)", ms, **tag, kernel=kernel, graph_ms=g, triton_graph_ms=g_tri,
        flashmla_graph_ms=g_fm, TFLOPs_graph=round(flops / g / 1e9) if g else None,
        default_over_triton_speed=round(g_tri / g, 3) if g and g_tri else None,
        default_over_fm_speed=round(g_fm / g, 3) if g and g_fm else None,
        launches_ms=launch_ms(lambda: sparse_mla.sparse_mla(q, kv, idx, 576**-0.5)))


@section("decode")
def decode():
    slots_total = 4096 if OPT.smoke else 262144
    fm = lib("flash_mla")
    for fp8 in (True, False):
        pool = torch.zeros(slots_total, 656 if fp8 else 576, dtype=torch.uint8 if fp8 else torch.bfloat16, device=DEV)
        for s in range(0, slots_total, 65536):
            e = min(slots_total, s + 65536)
            dispatch.store_mla_kv(pool, torch.randn(e - s, 512, device=DEV), torch.randn(e - s, 64, device=DEV),
                                  torch.arange(s, e, device=DEV))
        for heads in (64, 128):
            for batch in ([2] if OPT.smoke else [1, 32, 128]):
                if time.time() - T0 > OPT.budget * 0.85:
                    RES["errors"].append("decode: stopped early")
                    return
                q = torch.randn(batch, heads, 576, device=DEV).to(torch.bfloat16)
                idx = torch.randint(0, slots_total, (batch, K), device=DEV).int()
                flashmla = (lambda: dispatch._flashmla_decode(q, pool, idx, 576**-0.5)) if fp8 and fm else None
                mla_times(dict(section="decode", fp8=fp8, heads=heads, batch=batch), q, pool, idx, flashmla)
        del pool


def power_row(name, fn, seconds: float = 2.5, **tag) -> None:
    """fn replayed for `seconds` (a CUDA graph of ten calls) while nvidia-smi samples the SM clock,
    the board power, the temperature and the clock-limit reasons every 100 ms: time, clock and
    energy per call. At the board's power limit (reason 0x4, software power cap) the clock falls
    until the power fits, so a kernel's time there follows its energy, not its cycles
    (docs/PERFORMANCE.md, "The 700 W cap")."""
    from graph_timing import capture

    graph = capture(fn, 10)
    graph.replay()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active",
                            "--format=csv,noheader,nounits", "-lms", "100"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls, stop = 0, time.time() + seconds
    start.record()
    while time.time() < stop:
        graph.replay()
        calls += 10
        if calls % 100 == 0:
            torch.cuda.synchronize()  # keep the queue short, so the samples overlap the replays
    end.record()
    torch.cuda.synchronize()
    smi.terminate()
    samples = [line.split(",") for line in smi.communicate()[0].strip().splitlines()]
    samples = samples[len(samples) // 5:-1]  # the clock's first adjustments, and a sample past the end

    def median(i):
        return sorted(float(x[i]) for x in samples)[len(samples) // 2]

    us = start.elapsed_time(end) * 1e3 / calls
    row("power", name, us / 1e3, **tag, sm_mhz=median(0), watts=median(1), mj_per_call=round(us * median(1) * 1e-3, 1),
        temp_c=median(2), limit_reasons=sorted({x[3].strip() for x in samples}))


@section("power")
def power():
    """Clock, power and energy per call of ours and the references at the targets' shapes."""
    if OPT.smoke:  # no nvidia-smi or CUDA graphs on the CPU
        return
    RES["gpu"] = torch.cuda.get_device_name(0)
    # which board: clocks at the cap differ between boards of one model
    RES["power_limit_W"], RES["gpu_uuid"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=power.limit,uuid", "--format=csv,noheader,nounits"], capture_output=True,
        text=True).stdout.strip().split(", ")
    batch, ctx = 128, 32768
    pool = random_index_pool(batch * ctx // PAGE + 64, PAGE, DEV)
    for next_n in (1, 2, 4):
        q, w, table, lens = paged_case(batch, ctx, next_n, pool)
        tag = dict(kernel="indexer", batch=batch, ctx=ctx, next_n=next_n)
        power_row("ours", lambda: indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, ctx, next_n,
                                                                       clean_logits=False), **tag)
        if next_n < 4 and lib("deep_gemm") is not None:
            power_row("deepgemm", lambda: dispatch._deepgemm_paged(q, w, pool, table, lens, PAGE, ctx, next_n, False),
                      **tag)
    del pool
    slots = 262144
    kv = torch.zeros(slots, 656, dtype=torch.uint8, device=DEV)
    dispatch.store_mla_kv(kv, torch.randn(slots, 512, device=DEV), torch.randn(slots, 64, device=DEV),
                          torch.arange(slots, device=DEV))
    for heads, batch in ((128, 128), (128, 32), (64, 128)):
        q = torch.randn(batch, heads, 576, device=DEV).to(torch.bfloat16)
        idx = torch.randint(0, slots, (batch, K), device=DEV).int()
        tag = dict(kernel="sparse mla decode fp8", heads=heads, batch=batch)
        power_row("ours", lambda: sparse_mla.sparse_mla(q, kv, idx, 576**-0.5), **tag)
        if lib("flash_mla") is not None:
            power_row("flashmla", lambda: dispatch._flashmla_decode(q, kv, idx, 576**-0.5), **tag)


@section("prefill")
def prefill():
    nq, nk = (64, 512) if OPT.smoke else (4096, 32768)
    fm, dg = lib("flash_mla"), lib("deep_gemm")
    kv = torch.randn(nk, 576, device=DEV).to(torch.bfloat16)
    for heads in (128, 64):
        q = torch.randn(nq, heads, 576, device=DEV).to(torch.bfloat16)
        idx = torch.randint(0, nk, (nq, K), device=DEV).int()
        flashmla = (lambda: fm.flash_mla_sparse_fwd(q, kv.view(nk, 1, 576), idx.view(nq, 1, K), 576**-0.5, 512,
                                                    use_legacy=True)) if fm else None
        mla_times(dict(section="prefill", heads=heads, nq=nq, nk=nk), q, kv, idx, flashmla)
    # ragged indexer logits for one causal prefill chunk of nq queries at the end of nk keys
    q8 = torch.randn(nq, OPT.index_heads, 128, device=DEV).to(torch.float8_e4m3fn)
    w = torch.randn(nq, OPT.index_heads, device=DEV)
    k8 = torch.randn(nk, 128, device=DEV).to(torch.float8_e4m3fn)
    ks = torch.rand(nk, device=DEV)
    k_start = torch.zeros(nq, device=DEV, dtype=torch.int32)
    k_end = torch.arange(nk - nq + 1, nk + 1, device=DEV, dtype=torch.int32)
    ms = bench(lambda: indexer_logits.ragged_indexer_logits(q8, w, k8, ks, k_start, k_end, clean_logits=False))
    row("prefill", "triton ragged logits", ms, nq=nq, nk=nk,
        TFLOPs_fp8=round(2 * nq * OPT.index_heads * 128 * nk / ms / 1e9))
    if dg is not None:
        try:
            ms_d = bench(lambda: dg.fp8_mqa_logits(q8, (k8, ks), w, k_start, k_end, False))
            row("prefill", "deepgemm mqa logits", ms_d, nq=nq, nk=nk, ours_over_dg_speed=round(ms_d / ms, 3))
        except Exception as exc:  # noqa: BLE001
            RES["errors"].append(f"deepgemm ragged: {str(exc)[:200]}")
    # the prefill top-k (ragged transform) on those logits, alone and behind the indexer in one graph
    logits_fn = lambda: indexer_logits.ragged_indexer_logits(q8, w, k8, ks, k_start, k_end, clean_logits=False)  # noqa: E731
    logits = logits_fn()
    lens = (k_end - k_start).int()
    offs = torch.full((nq,), 1000, device=DEV, dtype=torch.int32)  # the sequence's first slot in the flat KV

    def prefill_topk(x):
        return dispatch.topk_transform(x, lens, K, "ragged", row_starts=k_start, offsets=offs, backend="triton")

    want = reference.ragged_transform_ref(reference.topk_positions_ref(logits, lens, K, k_start), offs)
    check(f"prefill top-k exact nq={nq} nk={nk}", torch.equal(prefill_topk(logits), want))
    g_idx, g_topk = bench_graph(logits_fn), bench_graph(lambda: prefill_topk(logits))
    both = bench_graph(lambda: prefill_topk(logits_fn()))
    row("prefill", "triton top-k, ragged transform, on the ragged logits", bench(lambda: prefill_topk(logits)), nq=nq,
        nk=nk, graph_ms=g_topk, indexer_graph_ms=g_idx,
        **(dict(graph_frac_of_indexer=round(g_topk / g_idx, 3), graph_ms_behind_indexer=round(both - g_idx, 5),
                graph_frac_of_indexer_behind_it=round((both - g_idx) / g_idx, 3)) if g_idx and g_topk and both else {}))


if __name__ == "__main__":
    torch.manual_seed(0)
    RES["backends"] = dispatch.available_backends(DEV) if DEV == "cuda" else {}
    for versions in ("triton", "deep_gemm", "flash_mla"):
        m = lib(versions) if versions != "triton" else __import__("triton")
        RES.setdefault("versions", {})[versions] = getattr(m, "__version__", None) if m else None
    RES["versions"]["torch"] = torch.__version__
    for run in (ceilings, correctness, indexer, topk_section, decode, prefill, power):
        run()
    RES["total_s"] = round(time.time() - T0, 1)
    save()
    print((OUT / "results.md").read_text())
