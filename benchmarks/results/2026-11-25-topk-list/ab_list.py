"""One device call: the cooperative top-k (kernels/topk_cooperative.py) with the per-program list
of the keys at or above the bracket, against the kernel before it (406eacd); exactness first
(default dispatch, and the kernel straight into outputs poisoned with -7), clock64 phase stamps,
then CUDA-graph times alone and behind the Gluon indexer. Writes $OUT/ab_list.json. Set up from
the repository root:

    mkdir -p .ab && git show 406eacd:kernels/topk_cooperative.py > .ab/topk_coop_old.py
    python3 benchmarks/results/2026-11-25-topk-list/make_stamped.py   # .ab/topk_coop_stamped.py
    sed 's/on_list = (value_rounds > 0) & (K \* 8 <= length)/on_list = n_listed < 0/' \
        kernels/topk_cooperative.py > .ab/topk_coop_nolist.py          # for `nolist`
    cp benchmarks/results/2026-11-25-topk-list/ab_list.py .ab/
    # on the device, carrying .device and .ab:
    source .device/setup.sh && python3 .ab/ab_list.py [quick] [nochecks] [phases] [nolist] [v:NAME ...]

v:NAME adds .ab/topk_coop_NAME.py as a variant. The variants measured on the way to the kept
kernel (docs/PERFORMANCE.md, "A list of the keys above the bracket") were such copies of
kernels/topk_cooperative.py; `listonly` (the slice's path cut, so wrong where a list overflows)
was timed with the flag of that name, which loaded .ab/topk_coop_listonly.py.
"""

import importlib.util
import json
import math
import os
import sys
import time

import torch
import triton
import triton.testing

from dsa_kernels import indexer_logits, reference, topk
from dsa_kernels import topk_cooperative as new

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name, file):
    spec = importlib.util.spec_from_file_location(f"dsa_kernels.{name}", os.path.join(HERE, file))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


old = load("topk_coop_old", "topk_coop_old.py")
nolist = load("topk_coop_nolist", "topk_coop_nolist.py") if "nolist" in sys.argv else None
stamped = load("topk_coop_stamped", "topk_coop_stamped.py")

DEV, K, PAGE = "cuda", 2048, 64
SMS = torch.cuda.get_device_properties(0).multi_processor_count
RES = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(0), sms=SMS, checks=[], rows=[], notes=[],
           phases=[])
OUT = os.environ.get("OUT", ".")


def save():
    with open(os.path.join(OUT, "ab_list.json"), "w") as f:
        json.dump(RES, f, indent=1)


def log(section, **kw):
    RES[section].append(kw)
    print(section, json.dumps(kw), flush=True)


def expected(logits, lens, table):
    return reference.paged_transform_ref(reference.topk_positions_ref(logits, lens, K), table, PAGE)


def runner(mod, parts, poison=False):
    """poison: the output starts as -7, so a launch that leaves slots unwritten cannot pass on what
    an earlier launch left in recycled memory (timings take torch.empty)."""
    def run(logits, lens, table):
        out = torch.empty(logits.shape[0], K, device=DEV, dtype=torch.int32)
        if poison:
            out.fill_(-7)
        if not mod.cooperative_topk(logits, lens, None, K, parts, out, topk.TRANSFORM_PAGED, table, PAGE, 1, None):
            raise RuntimeError(f"cooperative launch of {logits.shape[0]} x {parts} programs refused")
        return out
    return run


def rows_of(kind, n, w, g):
    x = torch.randn(n, w, device=DEV, generator=g)
    sample_pos = (torch.arange(1024, device=DEV) * w) // 1024
    if kind == "bf16":  # many ties
        return x.to(torch.bfloat16).float()
    if kind == "ints":  # massive ties: 16 values
        return torch.randint(0, 16, (n, w), device=DEV, generator=g).float()
    if kind == "inf":
        x[:, ::5] = float("-inf")
        x[:, 7::97] = float("inf")
        return x
    if kind == "skew":  # relu-like: a third of the row at one value
        return torch.relu(x - 0.5) * 3
    if kind in ("below", "above"):  # the sample misleads: the k-th key lies outside its bracket
        u = torch.rand(n, w, device=DEV, generator=g) * 0.5 + (0.5 if kind == "above" else 0.0)
        u[:, sample_pos] = torch.rand(n, 1024, device=DEV, generator=g)
        return u
    if kind == "ascending":  # the row's top keys all in its last programs: some programs list, some not
        return x.sort(dim=1).values
    return x


def correctness(shapes, kinds, repeats, make=None):
    g = torch.Generator(device=DEV).manual_seed(0)
    for n, w in shapes:
        parts = new.parts_per_row(n, w, SMS)
        for kind in kinds:
            logits = rows_of(kind, n, w, g)
            for lens_kind in ("full", "ragged"):
                if lens_kind == "full":
                    lens = torch.full((n,), w, device=DEV, dtype=torch.int32)
                else:
                    lens = torch.randint(1, w + 1, (n,), device=DEV, generator=g, dtype=torch.int32)
                    lens[0] = min(w, K)
                    if n > 1:
                        lens[1] = min(w, K + 1)
                table = torch.randperm(n * math.ceil(w / PAGE), device=DEV, generator=g).view(n, -1).int()
                want = expected(logits, lens, table)
                if make is None:
                    outs = [topk.topk_transform(logits, lens, K, topk.TRANSFORM_PAGED, block_table=table,
                                                page_size=PAGE) for _ in range(repeats)]
                else:
                    outs = [make(new, parts)(logits, lens, table) for _ in range(repeats)]
                if parts is not None:  # and straight through the kernel, into poisoned outputs
                    outs += [runner(new, parts, poison=True)(logits, lens, table) for _ in range(repeats)]
                bad = sum(int(not torch.equal(o, want)) for o in outs)
                log("checks", shape=[n, w], parts=parts, variant=make.__name__ if make else "default", kind=kind, lens=lens_kind, launches=len(outs), wrong=bad)
        save()


def graph_replays(n, w, replays):
    g = torch.Generator(device=DEV).manual_seed(1)
    logits = torch.randn(n, w, device=DEV, generator=g)
    lens = torch.full((n,), w, device=DEV, dtype=torch.int32)
    table = torch.randperm(n * w // PAGE, device=DEV, generator=g).view(n, -1).int()
    fn = runner(new, new.parts_per_row(n, w, SMS))
    fn(logits, lens, table)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(logits, lens, table)
    wrong = 0
    for _ in range(replays):
        logits.copy_(torch.randn(n, w, device=DEV, generator=g))
        graph.replay()
        wrong += int(not torch.equal(out, expected(logits, lens, table)))
    log("checks", shape=[n, w], kind="graph replays, fresh rows", launches=replays, wrong=wrong)


def index_pool(pages):
    pool = torch.empty(pages, PAGE * 132, dtype=torch.uint8, device=DEV)
    pool[:, : PAGE * 128] = torch.randn(pages, PAGE * 128, device=DEV).to(torch.float8_e4m3fn).view(torch.uint8)
    pool[:, PAGE * 128:] = (torch.rand(pages, PAGE, device=DEV) * 0.02 + 0.01).view(torch.uint8)
    return pool


def graph_us(fn):
    return 1000 * float(triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median"))


def indexer_case(n, w):
    pool = index_pool(n * w // PAGE + 64)
    table = torch.randperm(pool.shape[0], device=DEV)[: n * w // PAGE].view(n, -1).int()
    lens = torch.full((n,), w, device=DEV, dtype=torch.int32)
    q = torch.randn(n, 64, 128, device=DEV).to(torch.float8_e4m3fn)
    wts = torch.randn(n, 64, device=DEV) * 0.1

    def idx():
        return indexer_logits.paged_indexer_logits(q, wts, pool, table, lens, PAGE, w, 1, clean_logits=False)
    return idx, lens, table


def timings(shapes, rounds, variants):
    for n, w in shapes:
        idx, lens, table = indexer_case(n, w)
        logits = idx()
        want = expected(logits, lens, table)
        parts = new.parts_per_row(n, w, SMS)
        if parts is None:
            continue
        kernels = {name: make(parts) for name, make in variants.items()}
        ok = {}
        for name, fn in list(kernels.items()):
            try:
                ok[name] = torch.equal(variants[name](parts, poison=True)(logits, lens, table), want)
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
                log("rows", shape=[n, w], parts=parts, kernel=name, round=r, indexer_us=round(t_idx, 2),
                    alone_us=round(alone, 2), behind_us=round(behind, 2), share_behind=round(behind / t_idx, 3),
                    exact=ok[name])
        save()


def phases(shapes, launches):
    """clock64 stamps (make_stamped.py), cycles since the program's start, medians over its programs
    and launches; a stamp a program did not reach is left out."""
    for n, w in shapes:
        idx, lens, table = indexer_case(n, w)
        want = expected(idx(), lens, table)
        parts = new.parts_per_row(n, w, SMS)
        dbg = torch.zeros(n * parts * 32, device=DEV, dtype=torch.int64)
        stamped.DBG = dbg
        runs, listed = [], []
        for _ in range(launches):
            dbg.zero_()
            got = runner(stamped, parts)(idx(), lens, table)
            torch.cuda.synchronize()
            t = dbg.view(-1, 32)
            listed.append(t[:, 14].clone())
            t = torch.where(t > 0, t - t[:, :1], torch.full_like(t, -1))
            t[:, 14] = -1
            runs.append(t)
        t = torch.stack(runs).view(-1, 32).float()
        t = torch.where(t < 0, float("nan"), t)
        log("phases", shape=[n, w], parts=parts, exact=torch.equal(got, want),
            median_cycles=[None if math.isnan(v) else round(v) for v in t.nanmedian(0).values.tolist()],
            programs_on_list=round(float(torch.cat(listed).float().mean()), 3))
        save()


quick = "quick" in sys.argv
if "nochecks" not in sys.argv:
    correctness([(1, 4096), (1, 32768), (2, 32768), (8, 20000), (32, 32768), (33, 32768), (64, 32768), (16, 131072),
                 (32, 65536), (1, 131072), (4, 131072)],
                ["randn", "bf16", "ints", "inf", "skew", "below", "above", "ascending"], 2 if quick else 4)
    graph_replays(32, 32768, 50)
    save()
if "phases" in sys.argv:
    phases([(32, 32768), (8, 131072), (1, 32768), (1, 131072)], 5)
variants = {"old": lambda p, poison=False: runner(old, p, poison), "new": lambda p, poison=False: runner(new, p, poison)}
if "nolist" in sys.argv:
    variants["new, list off"] = lambda p, poison=False: runner(nolist, p, poison)
for arg in sys.argv[1:]:  # v:NAME adds .ab/topk_coop_NAME.py
    if arg.startswith("v:"):
        variants[arg[2:]] = (lambda mod: lambda p, poison=False: runner(mod, p, poison))(
            load(f"topk_coop_{arg[2:]}", f"topk_coop_{arg[2:]}.py"))
shapes = [(32, 32768), (16, 32768), (8, 32768), (1, 32768), (1, 131072), (4, 131072), (8, 131072), (2, 65536), (32, 4096)]
timings(shapes, 2, variants)
save()
print("done", sum(c["wrong"] for c in RES["checks"]), "wrong launches")
