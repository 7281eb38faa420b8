"""bench_engine.py as it is (SYNC=0) or with the indexer layers' read back of the longest context put back (SYNC=1)."""
import os
import runpy

if os.environ["SYNC"] == "1":
    from dsa_backend.attention import KernelDsaBackend

    topk = KernelDsaBackend.indexer_topk

    def indexer_topk_with_read_back(self, q, weights, pool, layer, batch, *args):
        int(batch.seq_lens.max())  # what _paged_logits read before the host copies
        return topk(self, q, weights, pool, layer, batch, *args)

    KernelDsaBackend.indexer_topk = indexer_topk_with_read_back
runpy.run_path("benchmarks/bench_engine.py", run_name="__main__")
