"""Triton kernels loaded while the engine serves.

Each load is a step whose requests waited: Triton compiles a kernel config on its first call
(seconds for the top-k and sparse MLA variants) or reads it from its disk cache (milliseconds).
After start-up that happens wherever a step has a shape no earlier step had, unless `warmup=true`
compiled its configs at start (docs/ENGINE.md, "Start-up warm-up"). The engine reports the count
and the time in its stats, dsa_llm as `dsa_kernel_loads_total` and
`dsa_kernel_load_seconds_total`, and each load is logged: a warning where it took long enough to
be a compile.
"""

from __future__ import annotations

import logging
import threading
import time

from dsa_kernels.compile_only import compiling_only

logger = logging.getLogger(__name__)
# Loads from Triton's disk cache take milliseconds; compiles, a second or more
_COMPILE_S = 0.25


class KernelLoads:
    """Counts Triton's loads through its JIT hooks, passing each call on to the hooks it replaced."""

    def __init__(self, before_hook=None, after_hook=None):
        self.count = 0
        self.seconds = 0.0
        self._before_hook, self._after_hook = before_hook, after_hook
        self._started: dict[int, float] = {}  # by thread: when its load began

    def before(self, **kw) -> bool | None:
        if not compiling_only():  # a warm-up's compiles keep no step waiting
            self._started[threading.get_ident()] = time.perf_counter()
        return self._before_hook(**kw) if self._before_hook else None  # True: the hook skips the compile

    def after(self, **kw) -> None:
        if compiling_only():
            if self._after_hook:
                self._after_hook(**kw)
            return
        began = self._started.pop(threading.get_ident(), None)
        seconds = time.perf_counter() - began if began is not None else 0.0
        self.count += 1
        self.seconds += seconds
        if seconds >= _COMPILE_S:
            logger.warning("Triton compiled kernel %s in %.2f s while serving; the step waited for it "
                           "(warmup=true compiles every config at start)", kw["fn"].name, seconds)
        else:
            logger.info("Triton loaded kernel %s in %.3f s while serving", kw["fn"].name, seconds)
        if self._after_hook:
            self._after_hook(**kw)


_WATCH: KernelLoads | None = None


def watch() -> KernelLoads | None:
    """The process's one KernelLoads, installed on first use; None without Triton's JIT hooks."""
    global _WATCH
    if _WATCH is None:
        try:
            import triton
            knobs = triton.knobs.runtime
            hooks = knobs.jit_cache_hook, knobs.jit_post_compile_hook
        except (ImportError, AttributeError):
            return None
        _WATCH = KernelLoads(*hooks)
        knobs.jit_cache_hook, knobs.jit_post_compile_hook = _WATCH.before, _WATCH.after
    return _WATCH
