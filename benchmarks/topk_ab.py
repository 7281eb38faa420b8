"""A/B of the top-k on the device: kernels/topk_cooperative.py ("new") and the three launches of
kernels/topk.py ("new, three launches") as they stand, against copies of either given as NAME=FILE,
e.g. the kernels of an earlier commit:

    mkdir -p .ab && git show REV:kernels/topk_cooperative.py > .ab/base.py
    git show REV:kernels/topk.py > .ab/base3.py
    # on the device, carrying .device and .ab:
    source .device/setup.sh && python3 benchmarks/topk_ab.py [quick] [nochecks] [flush] [everywhere] base=.ab/base.py base3=.ab/base3.py

`indexer=FILE` (a copy of kernels/indexer_gluon.py) times every kernel behind that indexer as
well as behind the current one. `flush` puts a 128 MiB copy before the indexer in every graph
(and takes its time off), as a layer's attention and MoE traffic comes between two indexers in a
model: nothing the last replay left in L2 survives to the next. `everywhere` times the three
launches at every shape too, beside a cooperative variant that serves more shapes than the default.
`shapes=ROWSxKEYS,...` times those shapes instead of the default list, `rounds=N` in N alternating
rounds (2).

Each kernel runs the shapes it serves: the cooperative launch those parts_per_row gives parts
for, the three launches every shape in the checks (with their own topk_config) and, in the
timings, those the cooperative launch does not serve (where the default path takes them).

Exactness first, every variant straight through the kernel into outputs poisoned with -7 (an
output from torch.empty may be recycled memory holding an earlier launch's right answer): 8 kinds
of rows, full and ragged lengths, 11 shapes; the default dispatch (topk_transform) on the same
rows, and 50 CUDA-graph replays on fresh rows. Then CUDA-graph times alone and behind the Gluon
indexer (one graph, less the indexer alone), the variants in alternating order. Prints one JSON
line a result and writes them all to $OUT/topk_ab.json.
"""

import importlib.util
import itertools
import json
import math
import os
import sys
import time

import torch

from dsa_kernels import indexer_logits, reference, topk
from dsa_kernels import topk_cooperative
from graph_timing import capture, graph_ms
from indexer_bench import random_index_pool

DEV, K, PAGE = "cuda", 2048, 64
SMS = torch.cuda.get_device_properties(0).multi_processor_count
RESULTS = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(0), sms=SMS, argv=sys.argv[1:],
               checks=[], rows=[], notes=[])
CHECK_SHAPES = [(1, 4096), (1, 32768), (2, 32768), (8, 20000), (32, 32768), (33, 32768), (64, 32768), (16, 131072),
                (32, 65536), (1, 131072), (4, 131072), (200, 32768), (264, 4096)]
ROW_KINDS = ["randn", "bf16", "ints", "inf", "skew", "below", "above", "ascending"]
TIME_SHAPES = [(32, 32768), (16, 32768), (8, 32768), (1, 32768), (1, 131072), (4, 131072), (8, 131072), (2, 65536),
               (32, 4096), (64, 32768), (128, 32768), (32, 131072), (128, 131072)]


def log(section, **fields):
    RESULTS[section].append(fields)
    print(section, json.dumps(fields), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "topk_ab.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)


def load_variant(name, path):
    """A copy of kernels/topk_cooperative.py as a module of the dsa_kernels package (its relative
    imports then resolve)."""
    spec = importlib.util.spec_from_file_location(f"dsa_kernels.ab_{name}", path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


def runner(module, n, w, poison=False):
    """The module's top-k for n rows of w keys, or None where it does not serve them."""
    cooperative = hasattr(module, "cooperative_topk")
    parts = module.parts_per_row(n, w, SMS) if cooperative else None
    if cooperative and parts is None:
        return None
    cfg = None if cooperative else module.topk_config(n, w, K, SMS)

    def run(logits, lens, table):
        out = torch.empty(logits.shape[0], K, device=DEV, dtype=torch.int32)
        if poison:
            out.fill_(-7)
        if cfg is not None:
            lists = module.candidate_lists(logits, lens, None, K, cfg)
            module.select_and_write(logits, lens, None, K, cfg, lists, out, topk.TRANSFORM_PAGED, table, PAGE, 1, None)
        elif not module.cooperative_topk(logits, lens, None, K, parts, out, topk.TRANSFORM_PAGED, table, PAGE, 1, None):
            raise RuntimeError(f"cooperative launch of {n} x {parts} programs refused")
        return out
    return run


def expected(logits, lens, table):
    return reference.paged_transform_ref(reference.topk_positions_ref(logits, lens, K), table, PAGE)


def rows_of(kind, n, w, g):
    x = torch.randn(n, w, device=DEV, generator=g)
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
        u[:, (torch.arange(1024, device=DEV) * w) // 1024] = torch.rand(n, 1024, device=DEV, generator=g)
        return u
    if kind == "ascending":  # the row's top keys all in its last programs: some programs list, some not
        return x.sort(dim=1).values
    return x


def correctness(variants, repeats):
    g = torch.Generator(device=DEV).manual_seed(0)
    for n, w in CHECK_SHAPES:
        runs = {name: runner(module, n, w, poison=True) for name, module in variants.items()}
        runs = {name: run for name, run in runs.items() if run is not None}
        for kind in ROW_KINDS:
            logits = rows_of(kind, n, w, g)
            for lens_kind in ("full", "ragged"):
                lens = torch.full((n,), w, device=DEV, dtype=torch.int32)
                if lens_kind == "ragged":  # with rows of exactly k and k + 1 keys
                    lens = torch.randint(1, w + 1, (n,), device=DEV, generator=g, dtype=torch.int32)
                    lens[: min(n, 2)] = torch.tensor([min(w, K), min(w, K + 1)][: min(n, 2)], device=DEV)
                table = torch.randperm(n * math.ceil(w / PAGE), device=DEV, generator=g).view(n, -1).int()
                want = expected(logits, lens, table)
                outs = {"default dispatch": [topk.topk_transform(logits, lens, K, topk.TRANSFORM_PAGED, block_table=table,
                                                                 page_size=PAGE) for _ in range(repeats)]}
                for name, run in runs.items():
                    outs[name] = [run(logits, lens, table) for _ in range(repeats)]
                for name, got in outs.items():
                    log("checks", shape=[n, w], kernel=name, kind=kind, lens=lens_kind, launches=len(got),
                        wrong=sum(int(not torch.equal(o, want)) for o in got))


def graph_replays(n, w, replays):
    g = torch.Generator(device=DEV).manual_seed(1)
    logits = torch.randn(n, w, device=DEV, generator=g)
    lens = torch.full((n,), w, device=DEV, dtype=torch.int32)
    table = torch.randperm(n * w // PAGE, device=DEV, generator=g).view(n, -1).int()
    run = runner(topk_cooperative, n, w)
    outs = []
    graph = capture(lambda: outs.append(run(logits, lens, table)), 1)
    out = outs[-1]  # the captured call's output
    wrong = 0
    for _ in range(replays):
        logits.copy_(torch.randn(n, w, device=DEV, generator=g))
        graph.replay()
        wrong += int(not torch.equal(out, expected(logits, lens, table)))
    log("checks", shape=[n, w], kernel="new", kind="graph replays, fresh rows", launches=replays, wrong=wrong)


def graph_us(fn):
    return 1000 * graph_ms(fn)


def indexer_case(n, w, gluon_module):
    """The Gluon indexer's logits for n rows of w keys (random e4m3 keys, fp32 scales), by
    gluon_module's kernel (a copy of kernels/indexer_gluon.py or the module itself)."""
    pages = n * w // PAGE
    pool = random_index_pool(pages + 64, PAGE, DEV)
    table = torch.randperm(pool.shape[0], device=DEV)[:pages].view(n, -1).int()
    lens = torch.full((n,), w, device=DEV, dtype=torch.int32)
    q = torch.randn(n, 64, 128, device=DEV).to(torch.float8_e4m3fn)
    weights = torch.randn(n, 64, device=DEV) * 0.1

    def indexer():
        indexer_logits.indexer_gluon = gluon_module  # the module paged_indexer_logits launches from
        return indexer_logits.paged_indexer_logits(q, weights, pool, table, lens, PAGE, w, 1, clean_logits=False)
    return indexer, lens, table


def flusher():
    """A copy that leaves nothing of an earlier replay in L2 (128 MiB read and written through 50 MB)."""
    src = torch.empty(1 << 25, device=DEV)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def timings(variants, indexers, rounds, flush):
    t_flush = graph_us(flush) if flush else 0.0
    for (n, w), (indexer_name, gluon_module) in itertools.product(TIME_SHAPES, indexers.items()):
        case, lens, table = indexer_case(n, w, gluon_module)

        def indexer(case=case):
            if flush:
                flush()
            return case()
        logits = case()
        want = expected(logits, lens, table)
        runs = {name: runner(module, n, w) for name, module in variants.items()}
        runs = {name: run for name, run in runs.items() if run is not None}
        # the three launches do not serve where the one launch does, unless every kernel is timed where it serves
        if "everywhere" not in sys.argv and any(hasattr(variants[name], "cooperative_topk") for name in runs):
            runs = {name: run for name, run in runs.items() if hasattr(variants[name], "cooperative_topk")}
        exact = {name: torch.equal(runner(variants[name], n, w, poison=True)(logits, lens, table), want) for name in runs}
        t_indexer = graph_us(indexer) - t_flush
        names = list(runs)
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                run = runs[name]
                alone = graph_us(lambda: run(logits, lens, table))
                behind = graph_us(lambda: run(indexer(), lens, table)) - t_indexer - t_flush
                log("rows", shape=[n, w], kernel=name, indexer=indexer_name, round=r, indexer_us=round(t_indexer, 2),
                    alone_us=round(alone, 2), behind_us=round(behind, 2), share_behind=round(behind / t_indexer, 3),
                    exact=exact[name])


def main():
    variants = {"new": topk_cooperative, "new, three launches": topk}
    indexers = {"new": indexer_logits.indexer_gluon}
    rounds = 2
    for arg in sys.argv[1:]:
        if arg.startswith("indexer="):
            indexers["base"] = load_variant("indexer_base", arg.split("=", 1)[1])
        elif arg.startswith("shapes="):
            TIME_SHAPES[:] = [tuple(int(v) for v in shape.split("x")) for shape in arg[len("shapes="):].split(",")]
        elif arg.startswith("rounds="):
            rounds = int(arg[len("rounds="):])
        elif "=" in arg:
            name, path = arg.split("=", 1)
            variants[name] = load_variant(name, path)
    quick = "quick" in sys.argv
    if "nochecks" not in sys.argv:
        correctness(variants, 2 if quick else 4)
        graph_replays(32, 32768, 50)
    timings(variants, indexers, rounds, flusher() if "flush" in sys.argv else None)
    wrong = sum(c["wrong"] for c in RESULTS["checks"])
    launches = sum(c["launches"] for c in RESULTS["checks"])
    log("notes", summary=f"{wrong} wrong of {launches} launches in {len(RESULTS['checks'])} checks")


if __name__ == "__main__":
    main()
