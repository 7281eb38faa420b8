"""Kernels Triton loads while the engine serves (dsa_backend/kernel_loads.py): counted, timed,
logged, and passed on to the JIT hooks they replaced. Triton's hooks are called directly here: on
the CPU nothing compiles (a GPU engine's loads show in dsa_llm's metrics, tests/serving)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from dsa_backend import kernel_loads
from dsa_backend.engine import Engine, EngineArgs

KERNEL = SimpleNamespace(name="_topk_kernel")


def test_each_load_is_counted_timed_and_handed_to_the_hooks_it_replaced(monkeypatch, caplog):
    seen = []
    loads = kernel_loads.KernelLoads(before_hook=lambda **kw: seen.append(("before", kw["fn"].name)) or True,
                                     after_hook=lambda **kw: seen.append(("after", kw["fn"].name)))
    clock = iter([10.0, 10.01, 20.0, 21.5])
    monkeypatch.setattr(kernel_loads.time, "perf_counter", lambda: next(clock))
    with caplog.at_level(logging.INFO, logger="dsa_backend.kernel_loads"):
        assert loads.before(fn=KERNEL) is True  # the replaced hook's answer (True: skip the compile)
        loads.after(fn=KERNEL)
        loads.before(fn=KERNEL)
        loads.after(fn=KERNEL)
    assert loads.count == 2 and abs(loads.seconds - 1.51) < 1e-9
    assert seen == [("before", "_topk_kernel"), ("after", "_topk_kernel")] * 2
    levels = [(r.levelname, "compiled" in r.getMessage()) for r in caplog.records]
    assert levels == [("INFO", False), ("WARNING", True)]  # 10 ms: read from the cache; 1.5 s: compiled


def test_compiles_inside_compile_only_are_passed_on_but_not_counted(monkeypatch):
    import importlib

    from dsa_kernels import compile_only

    # Triton's launcher left as it is
    monkeypatch.setattr(importlib.import_module("dsa_kernels.compile_only"), "_wrapped", True)
    seen = []
    loads = kernel_loads.KernelLoads(after_hook=lambda **kw: seen.append(kw["fn"].name))
    with compile_only():  # the engine's warm-up
        loads.before(fn=KERNEL)
        loads.after(fn=KERNEL)
    assert loads.count == 0 and loads.seconds == 0.0 and seen == ["_topk_kernel"]
    loads.before(fn=KERNEL)
    loads.after(fn=KERNEL)
    assert loads.count == 1


def test_the_watch_is_installed_once_over_tritons_hooks():
    import triton

    first = kernel_loads.watch()
    assert first is kernel_loads.watch()
    assert triton.knobs.runtime.jit_cache_hook == first.before
    assert triton.knobs.runtime.jit_post_compile_hook == first.after


def test_the_engine_reports_the_loads_since_it_was_ready(checkpoint):
    engine = Engine(EngineArgs(model=str(checkpoint("deepseek_v32")), device="cpu", dtype="float32", page_size=16,
                               max_model_len=128))
    assert engine.stats()["kernel_loads"] == 0 and engine.stats()["kernel_load_seconds"] == 0.0
    engine.kernel_loads.before(fn=KERNEL)
    engine.kernel_loads.after(fn=KERNEL)
    stats = engine.stats()
    assert stats["kernel_loads"] == 1 and 0.0 <= stats["kernel_load_seconds"] < 1.0
