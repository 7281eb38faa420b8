"""The one tl.dot wrapper the kernels share, for what Triton's CPU interpreter gets wrong."""

from __future__ import annotations

import os

import triton
import triton.language as tl

# Triton 3.9's interpreter multiplies bf16 tiles wrongly (values come out ~1e10): on the CPU the
# dots run on float32 copies instead; on the GPU they stay bf16 tensor-core dots.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def dot(a, b, EXACT: tl.constexpr):
    """a @ b; EXACT: on float32 copies with IEEE products (no TF32), for the interpreter and for
    float32 GEMMs that must match torch's float32 matmul."""
    if EXACT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)
