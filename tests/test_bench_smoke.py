"""benchmarks/bench_kernels.py at its --smoke sizes on the CPU (Triton's interpreter): every section
runs to the end and every correctness check it makes passes. Device time is scarce; a benchmark
that breaks there (a KeyError, a None where a CUDA-graph time would be) costs a whole call."""

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
