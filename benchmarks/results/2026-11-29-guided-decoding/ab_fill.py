"""A/B of guided decoding's host work at batch 64 on the v32 slice: bitmask fills serial or on
xgrammar's threads, and the last tokens read back before the step's forward or behind it."""
import json, statistics, sys
sys.path.insert(0, "benchmarks")
import torch
import xgrammar as xgr
from bench_engine import decode_throughput, _GUIDE
from dsa_backend.engine import Engine, EngineArgs
from dsa_backend import guided, sampling_params

batch = int(sys.argv[1]) if len(sys.argv) > 1 else 64
engine = Engine(EngineArgs(model="/tmp/v32", device="cuda", kv_cache_dtype="fp8", num_kv_pages=batch * 43 + 8,
                           max_running_requests=batch, max_num_batched_tokens=8192))
real_fill = guided.Grammars.token_bitmask

def serial(self, rows):
    if all(r is None for r in rows):
        return None
    bitmask = xgr.allocate_token_bitmask(len(rows), self.vocab_size)
    for i, row in enumerate(rows):
        if row is not None and not row[0].is_terminated():
            row[0].fill_next_token_bitmask(bitmask, i)
    return bitmask

def threads(n):
    m = xgr.BatchGrammarMatcher(max_threads=n)
    def fill(self, rows):
        self.__dict__["_batch"] = m
        return real_fill(self, rows)
    return fill

orig_prop = sampling_params.SamplingParams.matches_output_on_host
before = property(lambda self: self.guided_decoding is not None or orig_prop.fget(self))
variants = {"serial-behind": (serial, orig_prop), "serial-before": (serial, before),
            "threads1-behind": (threads(1), orig_prop), "threads4-behind": (threads(4), orig_prop),
            "threads8-behind": (threads(8), orig_prop)}
results = {}
for r in range(3):
    for tag in ["engine", *variants]:
        if tag != "engine":
            fill, prop = variants[tag]
            guided.Grammars.token_bitmask = fill
            sampling_params.SamplingParams.matches_output_on_host = prop
        g = None if tag == "engine" else _GUIDE
        out = decode_throughput(engine, None, engine.graphs, engine.overlap, g, batch, 2112, 32, 2, tag)
        results.setdefault(tag, []).append(out["median_step_ms"])
summary = {tag: statistics.median(v) for tag, v in results.items()}
print(json.dumps(dict(batch=batch, gpu=torch.cuda.get_device_name(), median_step_ms=summary, rounds=results)))
