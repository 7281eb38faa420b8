"""Kernel launches that compile and do not run.

Inside `compile_only()`, every Triton and Gluon kernel launch that this thread makes compiles its
config (or loads it from Triton's disk cache) and returns without running: its outputs keep
whatever their buffers held. The start-up warm-up (dsa_backend/warmup.py) calls the DSA backend
over every step shape this way. It needs each config compiled, not each call run, and running
thousands of calls over long contexts took as long as a warm cache's whole warm-up.

With `threads`, Triton's own asynchronous compile (AsyncCompileMode) hands each new config to a
thread pool and the launch returns at once; the block's end waits for them all. Triton starts a
config once however many launches meet it, so threads never compile the same config twice.

Torch ops and library kernels (DeepGEMM, FlashMLA) still run. Nothing may read a Triton kernel's
output as indices in such a block, as the warm-up's calls do not. A cooperative launch that the
driver would refuse is not found out here: its fallback's config compiles on its first real step.
Other threads launch as usual meanwhile: the flag is the entering thread's (a context variable),
and Triton's launcher, wrapped once per process, reads it.
"""

from __future__ import annotations

import contextlib
import contextvars
from concurrent.futures import ThreadPoolExecutor

_compiling = contextvars.ContextVar("dsa_kernels_compile_only", default=False)
_wrapped = False


def compiling_only() -> bool:
    """True inside compile_only() in this thread: launchers that bypass Triton's `run` must not
    launch either."""
    return _compiling.get()


def _wrap_triton_launcher() -> None:
    """Make Triton's launcher compile only where this thread is inside compile_only()."""
    global _wrapped
    if _wrapped:
        return
    from triton.runtime.jit import JITFunction

    run = JITFunction.run

    def run_or_compile(self, *args, grid, warmup, **kwargs):
        return run(self, *args, grid=grid, warmup=warmup or _compiling.get(), **kwargs)

    JITFunction.run, _wrapped = run_or_compile, True


@contextlib.contextmanager
def compile_only(threads: int = 0):
    """Every Triton launch this thread makes inside compiles and returns; with threads > 0 the
    compiles run on that many threads, all done (or raised) when the block ends."""
    if _compiling.get():
        raise RuntimeError("compile_only() is already active")
    _wrap_triton_launcher()
    token = _compiling.set(True)
    try:
        if threads > 0:
            from triton.runtime._async_compile import AsyncCompileMode

            with ThreadPoolExecutor(threads, thread_name_prefix="triton-compile") as pool, AsyncCompileMode(pool):
                yield
        else:
            yield
    finally:
        _compiling.reset(token)
