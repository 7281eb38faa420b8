"""Prototype A/B: the indexer stores the top-k's sample (contiguous) vs the top-k gathering it.
source .device/setup.sh && python3 .ab/sample_ab.py"""
import json, math, os, sys, time
sys.path.insert(0, "benchmarks")
import torch
from dsa_kernels import indexer_gluon, indexer_logits, reference, topk, topk_cooperative
from dsa_kernels.device import num_sms
from graph_timing import graph_ms

DEV, K, PAGE, S = "cuda", 2048, 64, 1024
SMS = num_sms(torch.device(DEV))
R = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(0), checks=[], rows=[])


def log(sec, **f):
    R[sec].append(f)
    print(sec, json.dumps(f), flush=True)
    json.dump(R, open(os.path.join(os.environ.get("OUT", "."), "sample_ab.json"), "w"), indent=1)


def case(n, w, next_n=1, ragged=False, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    reqs = n // next_n
    pages = reqs * math.ceil(w / PAGE)
    pool = torch.empty(pages + 64, PAGE * 132, dtype=torch.uint8, device=DEV)
    pool[:, : PAGE * 128] = torch.randn(pages + 64, PAGE * 128, device=DEV, generator=g).to(torch.float8_e4m3fn).view(torch.uint8)
    pool[:, PAGE * 128:] = (torch.rand(pages + 64, PAGE, device=DEV, generator=g) * 0.02 + 0.01).view(torch.uint8)
    table = torch.randperm(pool.shape[0], device=DEV, generator=g)[:pages].view(reqs, -1).int()
    if ragged:
        req_lens = torch.randint(1, w + 1 - next_n + 1, (reqs,), device=DEV, generator=g)
        req_lens[0] = w - next_n + 1
    else:
        req_lens = torch.full((reqs,), w - next_n + 1, device=DEV)
    lens = (req_lens[:, None] + torch.arange(next_n, device=DEV)[None, :]).reshape(-1).int()
    q = torch.randn(n, 64, 128, device=DEV, generator=g).to(torch.float8_e4m3fn)
    weights = torch.randn(n, 64, device=DEV, generator=g) * 0.1
    keys, scales = indexer_logits.pool_parts(pool, PAGE)
    cfg = indexer_gluon.gluon_config(reqs, w, next_n, SMS)
    tok_table = table.repeat_interleave(next_n, 0)

    def indexer(sample=None):
        return indexer_gluon.paged_indexer_logits(q, weights, keys, scales, table, lens, w, next_n, False, cfg, sample)
    return indexer, lens, tok_table


def topk_of(logits, lens, table, sample=None):
    out = torch.empty(logits.shape[0], K, device=DEV, dtype=torch.int32)
    parts = topk_cooperative.parts_per_row(logits.shape[0], logits.shape[1], SMS)
    assert parts is not None
    assert topk_cooperative.cooperative_topk(logits, lens, None, K, parts, out, topk.TRANSFORM_PAGED, table, PAGE, 1,
                                             None, sample=sample)
    return out


def checks():
    for (n, w, nn, ragged) in [(32, 32768, 1, False), (32, 32768, 1, True), (8, 20000, 1, True), (4, 131072, 1, True),
                               (64, 32768, 2, True), (128, 4096, 4, True), (12, 9000, 3, True), (1, 3000, 1, False),
                               (128, 32768, 1, True), (32, 131072, 1, False)]:
        indexer, lens, table = case(n, w, nn, ragged, seed=n + w)
        sample = torch.full((n, S), float("nan"), device=DEV)
        logits = indexer(sample)
        pos = (torch.arange(S, device=DEV)[None, :].long() * lens[:, None].long()) // S
        want_sample = logits.gather(1, pos)
        big = lens > 0
        sample_ok = torch.equal(sample[big], want_sample[big])
        entry = dict(shape=[n, w], next_n=nn, ragged=ragged, sample_equal=sample_ok)
        if topk_cooperative.parts_per_row(n, w, SMS) is not None:
            want = reference.paged_transform_ref(reference.topk_positions_ref(logits, lens, K), table, PAGE)
            entry["topk_sample_exact"] = torch.equal(topk_of(logits, lens, table, sample), want)
            entry["topk_plain_exact"] = torch.equal(topk_of(logits, lens, table), want)
        log("checks", **entry)


def timings():
    for n, w in [(32, 32768), (16, 32768), (8, 32768), (1, 32768), (2, 65536), (8, 131072), (4, 131072), (1, 131072),
                 (32, 4096), (64, 32768), (128, 32768), (32, 131072)]:
        indexer, lens, table = case(n, w)
        sample = torch.empty(n, S, device=DEV)
        us = lambda fn: 1000 * graph_ms(fn)
        for r in range(3):
            t = {}
            order = ["idx", "idx_s", "pair", "pair_s"]
            for name in (order if r % 2 == 0 else order[::-1]):
                if name == "idx":
                    t[name] = us(lambda: indexer())
                elif name == "idx_s":
                    t[name] = us(lambda: indexer(sample))
                elif name == "pair":
                    t[name] = us(lambda: topk_of(indexer(), lens, table))
                else:
                    t[name] = us(lambda: topk_of(indexer(sample), lens, table, sample))
            log("rows", shape=[n, w], round=r, **{k: round(v, 2) for k, v in t.items()},
                share=round((t["pair"] - t["idx"]) / t["idx"], 3), share_s=round((t["pair_s"] - t["idx_s"]) / t["idx_s"], 3),
                share_s_vs_plain_idx=round((t["pair_s"] - t["idx"]) / t["idx"], 3))


checks()
timings()
