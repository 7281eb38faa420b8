"""EngineRunner (the engine on a thread) and EngineProcess (that, in a child process) on the tiny
checkpoint: streamed outputs, bad input refused at submit, shutdown, and what happens when either
process dies (the child is started again, unless it keeps dying)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from checkpoints import random_prompts
from dsa_backend.engine import EngineArgs
from dsa_backend.runner import EngineRunner
from dsa_backend.engine_process import EngineProcess
from dsa_backend.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
RUNNERS = {"thread": EngineRunner, "process": EngineProcess}


def engine_args(path, **kw) -> EngineArgs:
    return EngineArgs(model=str(path), device="cpu", dtype="float32", page_size=16, **kw)


@pytest.fixture(scope="module")
def path(checkpoint):
    return checkpoint("glm_moe_dsa")


@pytest.fixture(scope="module", params=list(RUNNERS))
def runner(request, path):
    runner = RUNNERS[request.param](engine_args(path))
    yield runner
    runner.shutdown(10)


class Collector:
    """A request's outputs as the runner delivers them."""

    def __init__(self):
        self.outputs, self.done, self.started = [], threading.Event(), threading.Event()

    def __call__(self, out):
        self.outputs.append(out)
        self.started.set()
        if out.finished:
            self.done.set()

    @property
    def tokens(self) -> list[int]:
        return [t for o in self.outputs for t in o.new_token_ids]


def test_outputs_stream_and_finish_once(runner):
    got = Collector()
    runner.submit("a", random_prompts([10])[0], GREEDY, got)
    assert got.done.wait(60)
    assert len(got.tokens) == 6 and [o.finished for o in got.outputs].count(True) == 1
    assert got.outputs[-1].finish_reason == "length"


def test_both_runners_give_the_same_greedy_tokens(path, runner):
    prompt = random_prompts([13], seed=5)[0]
    got = Collector()
    runner.submit("same", prompt, GREEDY, got)
    assert got.done.wait(60)
    other = RUNNERS["process" if isinstance(runner, EngineRunner) else "thread"](engine_args(path))
    try:
        theirs = Collector()
        other.submit("same", prompt, GREEDY, theirs)
        assert theirs.done.wait(60)
    finally:
        other.shutdown(10)
    assert got.tokens == theirs.tokens


def test_bad_input_is_refused_at_submit_and_the_runner_keeps_serving(runner):
    with pytest.raises(ValueError, match="max_tokens"):
        runner.submit("huge", [3] * 10, SamplingParams(max_tokens=10**6), Collector())
    with pytest.raises(ValueError, match="prompt token ids"):
        runner.submit("oov", [10**9], GREEDY, Collector())
    got = Collector()
    runner.submit("dup", [3] * 10, SamplingParams(max_tokens=500, ignore_eos=True), got)
    with pytest.raises(ValueError, match="already in flight"):
        runner.submit("dup", [3] * 10, GREEDY, Collector())
    runner.abort("dup")
    assert got.done.wait(60) and got.outputs[-1].finish_reason == "abort"


def test_an_aborted_request_frees_its_pages_in_the_stats(runner):
    got = Collector()
    runner.submit("long", random_prompts([40], seed=9)[0], SamplingParams(max_tokens=2000, ignore_eos=True), got)
    assert got.started.wait(60)
    runner.abort("long")
    assert got.done.wait(60)
    stats = runner.stats()
    assert stats["running"] == 0
    assert stats["kv_pages_free"] == stats["kv_pages_total"]


@pytest.mark.parametrize("kind", list(RUNNERS))
def test_shutdown_ends_in_flight_requests_with_a_final_output(path, kind):
    runner = RUNNERS[kind](engine_args(path))
    finals, started = [], threading.Event()

    def on_output(out):
        started.set()
        if out.finished:
            finals.append(out)

    for i, p in enumerate(random_prompts([20, 25], seed=27)):
        runner.submit(f"r{i}", p, SamplingParams(max_tokens=2000, ignore_eos=True), on_output)
    assert started.wait(60)
    runner.shutdown(30)
    assert sorted(o.request_id for o in finals) == ["r0", "r1"]
    assert all(o.finish_reason == "abort" for o in finals)
    assert runner.stats()["kv_pages_free"] == runner.stats()["kv_pages_total"]


def test_a_bad_setting_fails_the_process_at_start_with_its_message(path):
    with pytest.raises(ValueError, match="max_running_requests must be positive"):
        EngineProcess(engine_args(path, max_running_requests=0))


def test_a_dead_engine_process_ends_its_requests_with_an_error_and_is_started_again(path):
    runner = EngineProcess(engine_args(path))
    try:
        got = Collector()
        runner.submit("r", random_prompts([20])[0], SamplingParams(max_tokens=2000, ignore_eos=True), got)
        assert got.started.wait(60)
        first = runner._process.pid
        os.kill(first, signal.SIGKILL)
        assert got.done.wait(30)
        assert got.outputs[-1].finish_reason == "error"
        assert "engine process has exited (code -9)" in got.outputs[-1].error
        again = _submit_when_taken(runner, "after", random_prompts([10], seed=3)[0])
        assert again.done.wait(60) and len(again.tokens) == 6 and again.outputs[-1].finish_reason == "length"
        assert runner._process.pid != first
        # Dead again right after its restart: a crash loop, so it stays down and says why.
        os.kill(runner._process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "not restarted" not in (runner._refusal or ""):
            time.sleep(0.1)
        with pytest.raises(RuntimeError, match="again within 60 s of a restart; it is not restarted"):
            runner.submit("refused", [3] * 10, GREEDY, Collector())
    finally:
        runner.shutdown(5)


def test_a_dying_engine_process_refuses_requests_before_it_is_gone(path):
    runner = EngineProcess(engine_args(path))
    try:
        gone = threading.Event()
        join = runner._process.join

        def slow_join(timeout=None):      # a GPU process can take seconds to exit after its pipe closed
            time.sleep(3)
            join(timeout)
            gone.set()

        runner._process.join = slow_join
        os.kill(runner._process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 2
        while runner.refusal is None and time.monotonic() < deadline:
            time.sleep(0.01)
        # refused before the process is gone, so Replicas sends new requests to the others
        assert runner.refusal == "the engine process has exited" and not gone.is_set()
        with pytest.raises(RuntimeError, match="the engine process has exited"):
            runner.submit("refused", [3] * 10, GREEDY, Collector())
    finally:
        runner.shutdown(5)


def _submit_when_taken(runner, request_id: str, prompt: list[int], timeout_s: float = 120) -> Collector:
    """Submit once the runner takes requests again (it refuses them while its child restarts)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = Collector()
        try:
            runner.submit(request_id, prompt, GREEDY, got)
            return got
        except RuntimeError as exc:
            assert "engine process has exited" in str(exc), exc   # not yet seen, or restarting
            assert time.monotonic() < deadline, "the engine process was not restarted"
            time.sleep(0.2)


def test_the_engine_process_stops_when_its_parent_dies(path):
    script = textwrap.dedent(f"""
        import os
        from dsa_backend.engine import EngineArgs
        from dsa_backend.engine_process import EngineProcess
        runner = EngineProcess(EngineArgs(model={str(path)!r}, device="cpu", dtype="float32", page_size=16))
        print(runner._process.pid, flush=True)
        os._exit(0)
    """)
    parent = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert parent.returncode == 0, parent.stderr
    child = int(parent.stdout.split()[-1])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.2)
    alive = _alive(child)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, "the engine process outlived its parent"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"     # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="an engine on the second GPU takes two GPUs")
@pytest.mark.parametrize("kind", list(RUNNERS))
def test_an_engine_on_the_second_gpu_runs_its_steps_on_a_thread_of_its_own(path, kind):
    # Triton launches a kernel on the thread's current device, cuda:0 unless set: the runner's
    # thread on an engine on cuda:1 once failed every step ("Pointer argument cannot be accessed
    # from Triton"), as dsa_llm's KIND_GPU instance on a machine's second GPU did.
    prompt = random_prompts([12], seed=5)[0]
    outputs = {}
    for device in ("cuda:0", "cuda:1"):
        runner = RUNNERS[kind](EngineArgs(model=str(path), device=device, dtype="float32", page_size=16,
                                          num_kv_pages=64, warmup=False))
        try:
            collector = Collector()
            runner.submit("r", prompt, GREEDY, collector)
            assert collector.done.wait(120)
            assert collector.outputs[-1].error is None, collector.outputs[-1].error
            outputs[device] = collector.tokens
        finally:
            runner.shutdown(10)
    assert len(outputs["cuda:1"]) == GREEDY.max_tokens and outputs["cuda:1"] == outputs["cuda:0"]
