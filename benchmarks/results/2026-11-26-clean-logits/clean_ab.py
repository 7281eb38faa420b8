"""What the engine's indexer saves by skipping the logits' -inf fill (clean_logits=False, as
dsa_backend/attention.py now asks, since the top-k reads only each row's range). CUDA-graph times,
clean True against False, through the dispatch:

- prefill: dispatch.ragged_indexer_logits over a batch of R requests of L tokens each (query t of
  request r sees r's keys up to itself, as KernelDsaBackend._ragged_logits builds them), then the
  ragged top-k as the engine calls it; T = R * L queries over T keys;
- decode: dispatch.paged_indexer_logits at next_n 1, full rows (every row max_len long) and rows of
  random lengths, then the top-k.

Both with the dispatch's default (DeepGEMM where it loads) and with backend="triton" (ours). Checks
that the top-k equals itself either way. Run: source .device/setup.sh && python3 clean_ab.py
"""

import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from graph_timing import graph_ms  # noqa: E402

from dsa_kernels import dispatch  # noqa: E402

DEV, K, PAGE, H = "cuda", 2048, 64, 64
RES = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(0), rows=[],
           backends=dispatch.available_backends(DEV))
g = torch.Generator(device=DEV).manual_seed(0)


def log(**row):
    RES["rows"].append(row)
    print(json.dumps(row), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "clean_ab.json"), "w") as f:
        json.dump(RES, f, indent=1)


def q_and_w(n):
    q = (torch.randn(n, H, 128, device=DEV, generator=g) * 0.5).to(torch.float8_e4m3fn)
    return q, torch.randn(n, H, device=DEV, generator=g)


def prefill(requests, length):
    t = requests * length
    q, w = q_and_w(t)
    k8 = (torch.randn(t, 128, device=DEV, generator=g) * 0.5).to(torch.float8_e4m3fn)
    ks = torch.rand(t, device=DEV, generator=g) + 0.5
    req = torch.arange(t, device=DEV) // length
    start = (req * length).int()
    pos = torch.arange(t, device=DEV) % length
    end = (start + pos + 1).int()
    context = (pos + 1).int()
    zeros = torch.zeros(t, dtype=torch.int32, device=DEV)
    for backend in ("auto", "triton"):
        picks = {}
        for clean in (True, False):
            def logits():
                return dispatch.ragged_indexer_logits(q, w, k8, ks, start, end, clean_logits=clean, backend=backend)

            def both():
                return dispatch.topk_transform(logits(), context, K, "ragged", row_starts=start, offsets=zeros,
                                               backend="triton")

            picks[clean] = both()
            log(kind="prefill", requests=requests, length=length, backend=backend, clean=clean,
                logits_ms=round(graph_ms(logits), 4), with_topk_ms=round(graph_ms(both), 4))
        log(kind="prefill", requests=requests, length=length, backend=backend,
            topk_equal=bool(torch.equal(picks[True], picks[False])))
        torch.cuda.empty_cache()


def decode(batch, max_len, ragged):
    pages = max_len // PAGE
    pool = torch.empty(batch * pages, PAGE * 132, device=DEV, dtype=torch.uint8)
    slots = torch.arange(batch * pages * PAGE, device=DEV)
    dispatch.store_index_keys(pool, torch.randn(len(slots), 128, device=DEV, generator=g), slots, PAGE)
    table = torch.randperm(batch * pages, device=DEV, generator=g).view(batch, pages).int()
    lens = (torch.randint(K + 1, max_len + 1, (batch,), device=DEV, generator=g) if ragged
            else torch.full((batch,), max_len, device=DEV)).int()
    q, w = q_and_w(batch)
    zeros = torch.zeros(batch, dtype=torch.int32, device=DEV)
    for backend in ("auto", "triton"):
        picks = {}
        for clean in (True, False):
            def logits():
                return dispatch.paged_indexer_logits(q, w, pool, table, lens, page_size=PAGE, max_context_len=max_len,
                                                     clean_logits=clean, backend=backend)

            def both():
                return dispatch.topk_transform(logits(), lens, K, "ragged", offsets=zeros, backend="triton")

            picks[clean] = both()
            log(kind="decode", batch=batch, max_len=max_len, ragged=ragged, backend=backend, clean=clean,
                logits_ms=round(graph_ms(logits), 4), with_topk_ms=round(graph_ms(both), 4))
        log(kind="decode", batch=batch, max_len=max_len, ragged=ragged, backend=backend,
            topk_equal=bool(torch.equal(picks[True], picks[False])))


if __name__ == "__main__":
    print(json.dumps(RES["backends"]))
    for r, length in ((1, 16384), (4, 4096), (16, 1024)):
        prefill(r, length)
    for batch, max_len in ((32, 32768), (128, 32768), (32, 131072)):
        for ragged in (False, True):
            decode(batch, max_len, ragged)
