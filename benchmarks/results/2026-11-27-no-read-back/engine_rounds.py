"""One engine, one process: decode steps timed in alternating rounds of three variants, so that
the between-process spread of the host-bound step (14-36 ms seen) does not enter the comparison.
  now       : the code as it is (grouped experts, no read back in the forward)
  loop      : the routed experts as the per-expert loop they were
  read_back : one read back of the longest context a layer with an indexer, as before the host copies
"""
import json
import statistics
import sys

import torch

sys.path.insert(0, "benchmarks")
from bench_engine import decode_throughput  # noqa: E402
from bench_moe import loop_over_experts  # noqa: E402
from dsa_backend.attention import KernelDsaBackend  # noqa: E402
from dsa_backend.engine import Engine, EngineArgs  # noqa: E402
from dsa_backend.models import moe  # noqa: E402

grouped_forward = moe.Experts.forward
indexer_topk = KernelDsaBackend.indexer_topk


def with_read_back(self, q, weights, pool, layer, batch, *args):
    int(batch.seq_lens.max())
    return indexer_topk(self, q, weights, pool, layer, batch, *args)


VARIANTS = {"now": (grouped_forward, indexer_topk), "loop": (loop_over_experts, indexer_topk),
            "read_back": (grouped_forward, with_read_back)}
model, rounds, batch, prompt_len, steps = sys.argv[1], int(sys.argv[2]), 32, 2112, 16
pages = batch * (-(-(prompt_len + 512) // 64)) + 8
engine = Engine(EngineArgs(model=model, device="cuda", kv_cache_dtype="fp8", num_kv_pages=pages,
                           max_running_requests=batch, max_num_batched_tokens=8192))
backend = KernelDsaBackend()
decode_throughput(engine, backend, batch, prompt_len, 4, 2, "compile")  # first steps compile
medians = {v: [] for v in VARIANTS}
for r in range(rounds):
    for v, (experts, topk) in VARIANTS.items():
        moe.Experts.forward, KernelDsaBackend.indexer_topk = experts, topk
        run = decode_throughput(engine, backend, batch, prompt_len, steps, 2, f"{v}-{r}")
        medians[v].append(run["median_step_ms"])
summary = {v: dict(medians=m, median=statistics.median(m)) for v, m in medians.items()}
summary["gpu"] = torch.cuda.get_device_name()
summary["loop_over_now"] = round(summary["loop"]["median"] / summary["now"]["median"], 3)
summary["read_back_over_now"] = round(summary["read_back"]["median"] / summary["now"]["median"], 3)
print(json.dumps(summary))
with open(sys.argv[3], "w") as f:
    json.dump(summary, f, indent=1)
