"""A/B: the indexer's table / length loads evict_last and the top-k's counter fetched early, against
the committed kernels (.ab/base_indexer.py, .ab/base_topk.py). source .device/setup.sh && python3 .ab/meta_ab.py"""
import importlib.util, json, math, os, sys, time
sys.path.insert(0, "benchmarks")
import torch
from dsa_kernels import indexer_gluon, indexer_logits, reference, topk, topk_cooperative
from dsa_kernels.device import num_sms
from graph_timing import graph_ms

DEV, K, PAGE = "cuda", 2048, 64
SMS = num_sms(torch.device(DEV))
R = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(0), checks=[], rows=[])


def log(sec, **f):
    R[sec].append(f)
    print(sec, json.dumps(f), flush=True)
    json.dump(R, open(os.path.join(os.environ.get("OUT", "."), "meta_ab.json"), "w"), indent=1)


def load(name, path):
    spec = importlib.util.spec_from_file_location(f"dsa_kernels.ab_{name}", path)
    m = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


IDX = {"base": load("base_indexer", ".ab/base_indexer.py"), "new": indexer_gluon}
TOPK = {"base": load("base_topk", ".ab/base_topk.py"), "new": topk_cooperative}


def case(n, w, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    pages = n * math.ceil(w / PAGE)
    pool = torch.empty(pages + 64, PAGE * 132, dtype=torch.uint8, device=DEV)
    pool[:, : PAGE * 128] = torch.randn(pages + 64, PAGE * 128, device=DEV, generator=g).to(torch.float8_e4m3fn).view(torch.uint8)
    pool[:, PAGE * 128:] = (torch.rand(pages + 64, PAGE, device=DEV, generator=g) * 0.02 + 0.01).view(torch.uint8)
    table = torch.randperm(pool.shape[0], device=DEV, generator=g)[:pages].view(n, -1).int()
    lens = torch.full((n,), w, device=DEV, dtype=torch.int32)
    q = torch.randn(n, 64, 128, device=DEV, generator=g).to(torch.float8_e4m3fn)
    weights = torch.randn(n, 64, device=DEV, generator=g) * 0.1
    keys, scales = indexer_logits.pool_parts(pool, PAGE)
    cfg = indexer_gluon.gluon_config(n, w, 1, SMS)
    idx = {name: (lambda m=m: m.paged_indexer_logits(q, weights, keys, scales, table, lens, w, 1, False, cfg))
           for name, m in IDX.items()}
    return idx, lens, table


def topk_of(m, logits, lens, table):
    out = torch.empty(logits.shape[0], K, device=DEV, dtype=torch.int32)
    parts = m.parts_per_row(logits.shape[0], logits.shape[1], SMS)
    if parts is None or not m.cooperative_topk(logits, lens, None, K, parts, out, topk.TRANSFORM_PAGED, table, PAGE, 1, None):
        lists = topk.candidate_lists(logits, lens, None, K, topk.topk_config(*logits.shape, K, SMS))
        topk.select_and_write(logits, lens, None, K, topk.topk_config(*logits.shape, K, SMS), lists, out,
                              topk.TRANSFORM_PAGED, table, PAGE, 1, None)
    return out


def flusher():
    src = torch.empty(1 << 25, device=DEV)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


flush = flusher()
t_flush = 1000 * graph_ms(flush)
combos = {"base": ("base", "base"), "indexer new": ("new", "base"), "both new": ("new", "new")}
for n, w in [(32, 32768), (16, 32768), (8, 131072), (64, 32768), (128, 32768), (32, 131072), (4, 131072)]:
    idx, lens, table = case(n, w, n + w)
    logits = idx["new"]()
    want = reference.paged_transform_ref(reference.topk_positions_ref(logits, lens, K), table, PAGE)
    log("checks", shape=[n, w], logits_equal=bool(torch.equal(logits, idx["base"]())),
        topk_new_exact=bool(torch.equal(topk_of(TOPK["new"], logits, lens, table), want)))
    names = list(combos)
    for r in range(3):
        for name in (names if r % 2 == 0 else names[::-1]):
            i, t = combos[name]
            row = dict(shape=[n, w], combo=name, round=r)
            row["idx"] = 1000 * graph_ms(idx[i])
            row["pair"] = 1000 * graph_ms(lambda: topk_of(TOPK[t], idx[i](), lens, table))
            row["share"] = (row["pair"] - row["idx"]) / row["idx"]
            if (n, w) in ((32, 32768), (128, 32768)):
                row["idx_flushed"] = 1000 * graph_ms(lambda: (flush(), idx[i]())) - t_flush
                row["pair_flushed"] = 1000 * graph_ms(lambda: (flush(), topk_of(TOPK[t], idx[i](), lens, table))) - t_flush
            log("rows", **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})
