"""One device call: the single-launch cooperative top-k (kernels/topk_cooperative.py) against the
three-launch top-k (kernels/topk.py), exactness first, then CUDA-graph times alone and behind the
Gluon indexer. Writes $OUT/ab_topk_coop.json.

    source .device/setup.sh && python3 benchmarks/results/2026-11-25-topk-cooperative/ab_topk_coop.py [quick]
"""

import json
import math
import os
import sys
import time

import torch
import triton
import triton.testing

from dsa_kernels import indexer_logits, reference, topk
from dsa_kernels import topk_cooperative as tc

DEV, K, PAGE = "cuda", 2048, 64
SMS = torch.cuda.get_device_properties(0).multi_processor_count
RES = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(0), sms=SMS, checks=[], rows=[], notes=[])
OUT = os.environ.get("OUT", ".")


def save():
    with open(os.path.join(OUT, "ab_topk_coop.json"), "w") as f:
        json.dump(RES, f, indent=1)


def log(section, **kw):
    RES[section].append(kw)
    print(section, json.dumps(kw), flush=True)


def expected(logits, lens, table):
    return reference.paged_transform_ref(reference.topk_positions_ref(logits, lens, K), table, PAGE)


def coop(logits, lens, table):
    return topk.topk_transform(logits, lens, K, topk.TRANSFORM_PAGED, block_table=table, page_size=PAGE)


def three(logits, lens, table):
    n, w = logits.shape
    return topk.topk_transform(logits, lens, K, topk.TRANSFORM_PAGED, block_table=table, page_size=PAGE,
                               config=topk.topk_config(n, w, K, SMS))


def rows_of(kind, n, w, g):
    if kind == "randn":
        return torch.randn(n, w, device=DEV, generator=g)
    if kind == "bf16":  # many ties
        return torch.randn(n, w, device=DEV, generator=g).to(torch.bfloat16).float()
    if kind == "ints":  # massive ties: 16 values
        return torch.randint(0, 16, (n, w), device=DEV, generator=g).float()
    if kind == "inf":
        x = torch.randn(n, w, device=DEV, generator=g)
        x[:, ::5] = float("-inf")
        x[:, 7::97] = float("inf")
        return x
    if kind == "skew":  # relu-like: a third of the row at one value
        return torch.relu(torch.randn(n, w, device=DEV, generator=g) - 0.5) * 3
    raise ValueError(kind)


def correctness(shapes, kinds, repeats):
    g = torch.Generator(device=DEV).manual_seed(0)
    for n, w in shapes:
        parts = tc.parts_per_row(n, w, SMS)
        for kind in kinds:
            logits = rows_of(kind, n, w, g)
            for lens_kind in ("full", "ragged"):
                if lens_kind == "full":
                    lens = torch.full((n,), w, device=DEV, dtype=torch.int32)
                else:
                    lens = torch.randint(1, w + 1, (n,), device=DEV, generator=g, dtype=torch.int32)
                    lens[0] = min(w, K)  # exactly k
                    if n > 1:
                        lens[1] = min(w, K + 1)
                table = torch.randperm(n * math.ceil(w / PAGE), device=DEV, generator=g).view(n, -1).int()
                want = expected(logits, lens, table)
                outs = [coop(logits, lens, table) for _ in range(repeats)]
                bad = sum(int(not torch.equal(o, want)) for o in outs)
                log("checks", shape=[n, w], parts=parts, kind=kind, lens=lens_kind, launches=repeats, wrong=bad)
        save()


def graph_replays(n, w, replays):
    g = torch.Generator(device=DEV).manual_seed(1)
    logits = torch.randn(n, w, device=DEV, generator=g)
    lens = torch.full((n,), w, device=DEV, dtype=torch.int32)
    table = torch.randperm(n * w // PAGE, device=DEV, generator=g).view(n, -1).int()
    want = expected(logits, lens, table)
    coop(logits, lens, table)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = coop(logits, lens, table)
    wrong = 0
    for i in range(replays):
        logits.copy_(torch.randn(n, w, device=DEV, generator=g))
        graph.replay()
        wrong += int(not torch.equal(out, expected(logits, lens, table)))
    log("checks", shape=[n, w], parts=tc.parts_per_row(n, w, SMS), kind="graph replays, fresh rows", launches=replays,
        wrong=wrong)


def index_pool(pages):
    pool = torch.empty(pages, PAGE * 132, dtype=torch.uint8, device=DEV)
    pool[:, : PAGE * 128] = torch.randn(pages, PAGE * 128, device=DEV).to(torch.float8_e4m3fn).view(torch.uint8)
    pool[:, PAGE * 128:] = (torch.rand(pages, PAGE, device=DEV) * 0.02 + 0.01).view(torch.uint8)
    return pool


def graph_us(fn):
    return 1000 * float(triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median"))


def coop_with(parts):
    def run(logits, lens, table):
        out = torch.empty(logits.shape[0], K, device=DEV, dtype=torch.int32)
        if not tc.cooperative_topk(logits, lens, None, K, parts, out, topk.TRANSFORM_PAGED, table, PAGE, 1, None):
            raise RuntimeError(f"cooperative launch of {logits.shape[0]} x {parts} programs refused")
        return out
    return run


def timings(shapes, rounds):
    for n, w in shapes:
        pool = index_pool(n * w // PAGE + 64)
        table = torch.randperm(pool.shape[0], device=DEV)[: n * w // PAGE].view(n, -1).int()
        lens = torch.full((n,), w, device=DEV, dtype=torch.int32)
        q = torch.randn(n, 64, 128, device=DEV).to(torch.float8_e4m3fn)
        wts = torch.randn(n, 64, device=DEV) * 0.1

        def idx():
            return indexer_logits.paged_indexer_logits(q, wts, pool, table, lens, PAGE, w, 1, clean_logits=False)

        logits = idx()
        want = expected(logits, lens, table)
        kernels = {"three": three}
        p = 1
        while n * p <= 2 * SMS:
            if w // p <= tc.MAX_SLICE and w // p >= 512:
                kernels[f"coop P={p}"] = coop_with(p)
            p *= 2
        ok = {}
        for name, fn in list(kernels.items()):
            try:
                ok[name] = torch.equal(fn(logits, lens, table), want)
                torch.cuda.synchronize()
            except Exception as exc:  # e.g. a cooperative grid too large to be resident
                log("notes", shape=[n, w], kernel=name, error=str(exc)[:200])
                del kernels[name]
        t_idx = graph_us(idx)
        names = list(kernels)
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                fn = kernels[name]
                alone = graph_us(lambda: fn(logits, lens, table))
                behind = graph_us(lambda: fn(idx(), lens, table)) - t_idx
                log("rows", shape=[n, w], default_parts=tc.parts_per_row(n, w, SMS), kernel=name, round=r,
                    indexer_us=round(t_idx, 2), alone_us=round(alone, 2), behind_us=round(behind, 2),
                    share_behind=round(behind / t_idx, 3), exact=ok[name])
        save()
        del pool


quick = "quick" in sys.argv
correctness([(1, 4096), (1, 32768), (2, 32768), (8, 20000), (32, 32768), (33, 32768), (64, 32768), (16, 131072),
             (32, 65536), (1, 131072), (4, 131072)], ["randn", "bf16", "ints", "inf", "skew"], 3 if quick else 8)
graph_replays(32, 32768, 50)
save()
if not quick:
    timings([(1, 32768), (4, 32768), (8, 32768), (16, 32768), (32, 32768), (1, 131072), (4, 131072), (8, 131072),
             (1, 4096), (32, 4096)], 2)
save()
print("done", sum(c["wrong"] for c in RES["checks"]), "wrong launches")
