"""bench_engine.py with the routed experts as they are (MOE=grouped) or as the loop they were (MOE=loop)."""
import os
import runpy
import sys

sys.path.insert(0, "benchmarks")
if os.environ["MOE"] == "loop":
    from bench_moe import loop_over_experts
    from dsa_backend.models import moe

    moe.Experts.forward = loop_over_experts
runpy.run_path("benchmarks/bench_engine.py", run_name="__main__")
