"""The Gluon kernels build for Hopper (sm_90) with the installed Triton, on a machine without a GPU.

Gluon has no interpreter, so their numerics are tested on the GPU only (the `gpu` tests); what the
CPU can check is that they still compile with this Triton, whose Gluon API moved after 3.6 (the GPU
machine's; kernels/gluon_compat.py bridges the two), that they fit one block's shared memory, and
that ptxas kept their wgmma pipelines (it says when it serializes one, silently slowing the kernel).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

MAX_SHARED = 232448  # bytes of shared memory one block may have on sm_90


def test_gluon_kernels_build_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("gluon_build.py"))], env=env,
                         capture_output=True, text=True, timeout=600)
    built = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert run.returncode == 0 and len(built) == 18, run.stderr[-3000:]
    for k in built[:9]:  # sparse MLA, split and balanced grids: Q, two key buffers and P, one program per
        # SM; gathers by cp.async
        assert 200 * 1024 < k["shared"] <= MAX_SHARED and k["cp_async"], k
        assert k["setmaxnreg"], k  # three warpgroups for either pool, registers reallocated
        # the splits meet only where they merge in the kernel, whose loads spill no more than a few
        # words (its passes' widths, kernels/sparse_mla_gluon_meet.merge_share; 76 bytes at two splits over
        # an FP8 pool with Triton 3.9, 60 with 3.6, the GPU machine's); a balanced grid's warpgroups
        # carry their runs' state besides (104 bytes over an FP8 pool with 3.9, 128 with 3.6)
        assert k["meets"] == bool(k["merge"]) and k["spilled"] <= (128 if k["balanced"] else 80), k
    for pair in built[9:11]:  # FP8 at 128 heads as CTA pairs, split and balanced grids: the cluster
        # operations in, the mbarriers where the pushes and remote arrivals address them in both
        # builds, and no more spilled than the others (a tensor operand in cta_pair.cluster_sync
        # spilled the scorer's loop: 156 bytes; Triton 3.9 spills 40 and 24 bytes, 3.6 76 and 112)
        assert pair["shared"] <= MAX_SHARED and pair["setmaxnreg"] and pair["cluster_ops"], pair
        assert pair["offsets_kept"] and pair["spilled"] <= 64, pair
    for k in built[11:]:  # the paged indexer at next_n 1, 2, 4, next_n 2 one MMA at a time (one tile and two
        # tiles an iteration), next_n 3 a program a token and 5 two tokens a program: TMA copies; logits
        # kept in L2 for the top-k
        assert k["shared"] <= MAX_SHARED and k["tma"] and k["logits_evict_last"], k
    # ptxas keeps their wgmma pipelines (no "wgmma ... serialized", no "setmaxnreg ignored"): the
    # paged indexer's MMA runs under the scoring of the unit before, and sparse MLA's register
    # split holds
    for k in built:
        assert not k["ptxas_warnings"], k
