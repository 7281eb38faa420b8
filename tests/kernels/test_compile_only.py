"""dsa_kernels.compile_only: Triton launches inside compile their config and do not run."""

import importlib
import threading

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import _async_compile
from triton.runtime.jit import JITFunction

from dsa_kernels.compile_only import compile_only, compiling_only

module = importlib.import_module("dsa_kernels.compile_only")  # dsa_kernels.compile_only is the function


@pytest.fixture
def asked(monkeypatch):
    """Triton's launcher replaced by one that records (argument, warmup), wrapped afresh."""
    calls = []
    monkeypatch.setattr(JITFunction, "run", lambda self, *args, grid, warmup, **kw: calls.append((args[0], warmup)))
    monkeypatch.setattr(module, "_wrapped", False)
    return calls


def test_launches_inside_ask_triton_to_compile_only(asked):
    with compile_only():
        assert compiling_only() and _async_compile.active_mode.get() is None  # no threads: compiles in line
        JITFunction.run(None, 7, grid=(1,), warmup=False)
    JITFunction.run(None, 8, grid=(1,), warmup=False)
    assert asked == [(7, True), (8, False)] and not compiling_only()


def test_other_threads_launch_as_usual_meanwhile(asked):
    with compile_only():
        other = threading.Thread(target=lambda: JITFunction.run(None, 9, grid=(1,), warmup=False))
        other.start()
        other.join()
        JITFunction.run(None, 7, grid=(1,), warmup=False)
    assert asked == [(9, False), (7, True)]


def test_with_threads_triton_compiles_asynchronously_inside_only():
    with compile_only(threads=2):
        assert isinstance(_async_compile.active_mode.get(), _async_compile.AsyncCompileMode)
    assert _async_compile.active_mode.get() is None


def test_a_failure_inside_ends_the_block_and_nesting_is_refused(asked):
    with pytest.raises(ValueError, match="boom"), compile_only(threads=2):
        with pytest.raises(RuntimeError, match="already active"), compile_only():
            pass
        raise ValueError("boom")
    assert not compiling_only() and _async_compile.active_mode.get() is None
    JITFunction.run(None, 8, grid=(1,), warmup=False)
    assert asked == [(8, False)]


@triton.jit
def _fill_kernel(out_ptr, value, BLOCK: tl.constexpr):
    tl.store(out_ptr + tl.arange(0, BLOCK), tl.zeros((BLOCK,), tl.float32) + value)


@pytest.mark.gpu
@pytest.mark.parametrize("threads", [0, 2])
def test_a_kernel_compiled_inside_is_not_run_and_is_not_compiled_again_after(monkeypatch, threads):
    compiled = []
    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook", lambda **kw: compiled.append(kw["fn"].name))
    out = torch.zeros(64, device="cuda")
    block = 64 if threads else 32  # a config of its own per case: the first compiles it
    with compile_only(threads):
        _fill_kernel[(1,)](out, 3.0, BLOCK=block)
        _fill_kernel[(1,)](out, 4.0, BLOCK=block)
    torch.cuda.synchronize()
    # one compile; Triton 3.6 calls the hook again for a launch that meets it still compiling
    assert set(compiled) == {"_fill_kernel"} and len(compiled) <= (1 if threads == 0 else 2)
    assert torch.count_nonzero(out) == 0
    compiled.clear()
    _fill_kernel[(1,)](out, 5.0, BLOCK=block)
    torch.cuda.synchronize()
    assert compiled == [] and torch.all(out[:block] == 5.0)
