"""Session 60, call 5: the kernel-load counter on the GPU (Triton 3.6's JIT hooks), through an engine."""
import logging, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
from dsa_backend import LLM, SamplingParams
llm = LLM(sys.argv[1], device="cuda", page_size=64, max_model_len=4096, max_running_requests=8)
p = SamplingParams(max_tokens=16, temperature=0)
print("ready", llm.engine.stats()["kernel_loads"])
llm.generate(["The quick brown fox jumps over the lazy dog."] * 3, p)
s1 = llm.engine.stats(); print("after first", s1["kernel_loads"], round(s1["kernel_load_seconds"], 2))
llm.generate(["A different prompt of about the same length, twice."] * 3, p)
s2 = llm.engine.stats(); print("after same shapes again", s2["kernel_loads"], round(s2["kernel_load_seconds"], 2))
llm.generate(["Now five requests of a new batch size."] * 5, p)
s3 = llm.engine.stats(); print("after a new batch size", s3["kernel_loads"], round(s3["kernel_load_seconds"], 2))
