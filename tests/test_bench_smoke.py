"""benchmarks/bench_kernels.py at its --smoke sizes on the CPU (Triton's interpreter): every section
runs to the end and every correctness check it makes passes; bench_engine.py,
bench_prefix_cache.py and bench_prefill.py on a tiny checkpoint, bench_serving.py through a real
server, bench_warmup.py on the CPU.
Device time is scarce; a benchmark that breaks there (a KeyError, a None where a CUDA-graph time
would be) costs a whole call."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_kernels.py"


def smoke(tmp_path, *args):
    env = dict(os.environ, TRITON_INTERPRET="1", OUT=str(tmp_path))
    run = subprocess.run([sys.executable, str(SCRIPT), "--smoke", *args], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((tmp_path / "results.json").read_text())


def test_every_section_runs_and_its_checks_pass(tmp_path):
    res = smoke(tmp_path)
    assert res["errors"] == []
    assert {r["section"] for r in res["rows"]} >= {"indexer", "topk", "decode", "prefill"}
    failed = [c for c in res["checks"] if not c["ok"]]
    assert res["checks"] and not failed, failed


@pytest.mark.parametrize("only", ["indexer", "topk"])
def test_one_section_stands_alone(tmp_path, only):
    res = smoke(tmp_path, "--only", only)
    assert res["errors"] == [] and {r["section"] for r in res["rows"]} == {only}


def test_the_engine_benchmark_alternates_backends_in_rounds_on_the_cpu(tmp_path, checkpoint):
    script = SCRIPT.parent / "bench_engine.py"
    out = tmp_path / "engine.json"
    run = subprocess.run([sys.executable, str(script), "--model", str(checkpoint("deepseek_v32")), "--device", "cpu",
                          "--batch", "2", "--prompt-len", "40", "--steps", "2", "--rounds", "2",
                          "--backends", "kernel,torch,guided",
                          "--kv-cache-dtype", "auto", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    res = json.loads(out.read_text())
    assert [(r["backend"], r["round"]) for r in res["runs"]] == [
        ("kernel", 0), ("torch", 0), ("guided", 0), ("kernel", 1), ("torch", 1), ("guided", 1)]
    for tag in ("kernel", "torch"):
        steps = sorted(r["median_step_ms"] for r in res["runs"] if r["backend"] == tag)
        assert res["median_over_rounds"][tag]["median_step_ms"] == (steps[0] + steps[1]) / 2
    assert res["kernel_over_torch"] > 0
    # the default guide's records outlast the timed steps: every guided request decodes in each
    assert all(r["tokens"] == 2 * 2 for r in res["runs"] if r["backend"] == "guided")


def test_the_engine_benchmark_times_two_tensor_parallel_ranks_as_built(tmp_path, checkpoint):
    script = SCRIPT.parent / "bench_engine.py"
    out = tmp_path / "engine.json"
    args = [sys.executable, str(script), "--model", str(checkpoint("deepseek_v32")), "--device", "cpu", "--batch", "2",
            "--prompt-len", "40", "--steps", "2", "--kv-cache-dtype", "auto", "--tensor-parallel-size", "2"]
    refused = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "runs --backends engine alone" in refused.stderr
    run = subprocess.run(args + ["--backends", "engine", "--json", str(out)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["tensor_parallel_size"] == 2 and [r["backend"] for r in res["runs"]] == ["engine"]
    assert res["runs"][0]["tokens"] == 2 * 2


def test_the_engine_benchmark_runs_an_engine_a_fp8_weights_setting(tmp_path, checkpoint):
    script = SCRIPT.parent / "bench_engine.py"
    out = tmp_path / "engine.json"
    run = subprocess.run([sys.executable, str(script), "--model", str(checkpoint("deepseek_v32_fp8")), "--device",
                          "cpu", "--batch", "2", "--prompt-len", "40", "--steps", "2", "--backends", "kernel",
                          "--fp8-weights", "keep,dequantize", "--kv-cache-dtype", "auto", "--temperature", "0.8",
                          "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    res = json.loads(out.read_text())
    assert [r["backend"] for r in res["runs"]] == ["kernel-keep", "kernel-dequantize"] and res["temperature"] == 0.8
    assert res["kernel-keep_over_kernel-dequantize"] > 0


def test_the_prefix_cache_benchmark_finds_the_prefix_only_when_on(tmp_path, checkpoint):
    script = SCRIPT.parent / "bench_prefix_cache.py"
    out = tmp_path / "prefix.json"
    run = subprocess.run([sys.executable, str(script), "--model", str(checkpoint("deepseek_v32")), "--device", "cpu",
                          "--prefix-len", "130", "--suffix-len", "5", "--batch", "2", "--max-tokens", "2",
                          "--rounds", "1", "--kv-cache-dtype", "auto", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    res = json.loads(out.read_text())
    # pages of 64: the prefix's two whole pages, for the request alone and each of the batch's two
    # when warm; when cold, the batch's second request waits for the first's
    assert [(r["mode"], r["cached_tokens"]) for r in res["runs"]] == [("off", 0), ("cold-no-wait", 0),
                                                                       ("cold", 128), ("on", 3 * 128)]
    assert res["on_over_off"]["batch_done_ms"] > 0 and res["cold_over_cold_no_wait"]["batch_done_ms"] > 0


def test_the_prefill_benchmark_times_every_round(tmp_path, checkpoint):
    script = SCRIPT.parent / "bench_prefill.py"
    out = tmp_path / "prefill.json"
    run = subprocess.run([sys.executable, str(script), "--model", str(checkpoint("deepseek_v32_fp8")), "--device", "cpu",
                          "--prompt-len", "150", "--batch", "2", "--rounds", "2", "--max-num-batched-tokens", "128",
                          "--kv-cache-dtype", "auto", "--fp8-warmup", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["fp8_warmup"] and len(res["rounds_s"]) == 2 and all(s > 0 for s in res["rounds_s"])
    assert res["prompt_tokens_per_s"] == round(2 * 150 / res["median_s"])


def test_the_serving_benchmark_runs_both_sides_through_a_real_server_to_the_ensemble_and_to_dsa_llm(tmp_path, checkpoint):
    script = SCRIPT.parent / "bench_serving.py"
    out = tmp_path / "serving.json"
    run = subprocess.run([sys.executable, str(script), "--model", str(checkpoint("glm_moe_dsa")), "--concurrency", "2",
                          "--waves", "1", "--input-len", "12", "--output-len", "4", "--set", "num_kv_pages=64",
                          "--set", "page_size=16", "--repository", str(tmp_path / "model_repository"),
                          "--served-models", "dsa", "dsa_llm", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    ensemble, direct = json.loads(out.read_text())["levels"]
    assert (ensemble["served_model"], direct["served_model"]) == ("dsa", "dsa_llm")
    for level in (ensemble, direct):
        assert level["served"]["errors"] == 0
        # min_tokens = max_tokens: both sides make exactly 2 requests x 4 tokens
        assert level["engine"]["output_tokens"] == level["served"]["output_tokens"] == 8
        assert level["served_over_engine_tokens_per_s"] > 0
    models = ensemble["served"]["triton_models"]
    assert models["dsa_llm"]["requests"] == 2 and models["postprocessing"]["requests"] >= 2
    # text straight to dsa_llm: no ensemble step ran
    models = direct["served"]["triton_models"]
    assert models["dsa_llm"]["requests"] == 2 and models["postprocessing"]["requests"] == 0


def test_the_warmup_benchmark_runs_each_thread_count_in_processes_of_their_own(tmp_path):
    out = tmp_path / "warmup.json"
    run = subprocess.run([sys.executable, str(SCRIPT.parent / "bench_warmup.py"), "--device", "cpu", "--limits", "2",
                          "16", "128", "--threads", "2", "0", "--warm", "--check", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    threaded, serial = json.loads(out.read_text())["runs"]
    # the CPU compiles nothing, so the warm-up makes no call; the plumbing is what is checked
    assert (threaded["cold"]["threads"], serial["warm"]["threads"]) == (2, 0)
    assert all(run["loads_after"] == 0 and "error" not in run for case in (threaded, serial) for run in case.values())
