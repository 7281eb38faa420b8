"""Gluon names that moved after Triton 3.6 (the GPU machine's): the kernels call these, so they
compile on 3.6 and on later releases alike; and for a release they still do not compile with, a
fallback to the Triton kernels rather than a failed step."""

import logging

import triton
from triton.compiler.errors import CompilationError
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import tma

# every thread of the CTA (in a warp-specialized partition: of the partition) gets here
barrier = getattr(gl, "barrier", None) or gl.thread_barrier
# cp.async of the elements a pointer tensor names into shared memory, mask= off as zeros
cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
# a TMA copy (desc, coord, mbarrier, result)
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))  # 3.6: _reinterpret
log = logging.getLogger(__name__)


@gluon.jit
def reinterpret(smem, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
    """The same shared memory as another dtype, shape and layout."""
    if _REINTERPRET:
        return smem.reinterpret(dtype, shape, layout)
    else:
        return smem._reinterpret(dtype, shape, layout)


# --- a Triton whose Gluon the kernels do not compile with: their Triton kernels serve instead
_BROKEN: set[str] = set()


def compiles(kernel: str) -> bool:
    """False once `kernel` failed to compile in this process (with_fallback)."""
    return kernel not in _BROKEN


def with_fallback(kernel: str, run, fallback):
    """run(); if the Gluon kernel does not compile with this Triton, say so once and take fallback()
    now and (through compiles()) from then on. Nothing has run when compilation fails."""
    try:
        return run()
    except CompilationError as exc:
        _BROKEN.add(kernel)
        log.warning("%s does not compile with Triton %s, its Triton kernel serves instead: %s", kernel,
                    triton.__version__, str(exc).strip().splitlines()[-1][:300])
        return fallback()
