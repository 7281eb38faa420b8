"""Session 53 baseline: where a sampling step with a repetition penalty spends its time (old API)."""
import json, statistics, sys, time
import torch
from dsa_backend.sampling import SamplingBatch, SamplingRow, sample
from dsa_backend.sampling_params import SamplingParams

B, PROMPT, VOCAB = int(sys.argv[1]), 2112, 129280
dev = torch.device("cuda")
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(0, VOCAB, (PROMPT,), generator=g).tolist() for _ in range(B)]
outputs = [torch.randint(0, VOCAB, (64,), generator=g).tolist() for _ in range(B)]
params = SamplingParams(max_tokens=4096, repetition_penalty=1.1, temperature=0.0)
logits = torch.randn(B, VOCAB, device=dev)
host, gpu, total = [], [], []
for it in range(60):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    rows = [SamplingRow(params, p, o) for p, o in zip(prompts, outputs)]
    batch = SamplingBatch.build(rows, VOCAB, [1], dev)
    t1 = time.perf_counter()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); out = sample(logits, batch); e.record()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    for o, t in zip(outputs, out.token_ids.tolist()):
        o.append(t)
    if it >= 10:
        host.append((t1 - t0) * 1e3); gpu.append(s.elapsed_time(e)); total.append((t2 - t0) * 1e3)
print(json.dumps({"batch": B, "host_build_ms": statistics.median(host), "gpu_sample_ms": statistics.median(gpu),
                  "total_ms": statistics.median(total)}))
