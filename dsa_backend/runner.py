"""The engine on a background thread (EngineRunner), and the requests' output callbacks, which it
and EngineProcess (engine_process.py, on the far side of its pipe) hold in an OutputRouter."""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

from dsa_backend.engine import Engine, EngineArgs, RequestOutput
from dsa_backend.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

OutputCallback = Callable[[RequestOutput], None]
# A step's outputs and the engine's stats after it
StepSink = Callable[[list[RequestOutput], dict[str, float]], None]


def error_output(request_id: str, num_prompt_tokens: int, message: str) -> RequestOutput:
    """The final output of a request that failed."""
    return RequestOutput(request_id, [], None, None, True, "error", num_prompt_tokens, 0, error=message)


class OutputRouter:
    """Each request's output callback: registered at submit, called with each of its outputs,
    dropped after its final one."""

    def __init__(self):
        self._callbacks: dict[str, OutputCallback] = {}
        self._lock = threading.Lock()

    def register(self, request_id: str, on_output: OutputCallback) -> None:
        with self._lock:
            if request_id in self._callbacks:
                raise ValueError(f"request_id {request_id!r} is already in flight")
            self._callbacks[request_id] = on_output

    def discard(self, request_id: str) -> None:
        with self._lock:
            self._callbacks.pop(request_id, None)

    def in_flight(self) -> list[str]:
        with self._lock:
            return list(self._callbacks)

    def __len__(self) -> int:
        return len(self._callbacks)

    def deliver(self, outputs: list[RequestOutput]) -> None:
        with self._lock:
            callbacks = [(out, self._callbacks.get(out.request_id)) for out in outputs]
            for out in outputs:
                if out.finished:
                    self._callbacks.pop(out.request_id, None)
        for out, callback in callbacks:
            if callback is None:
                continue
            try:
                callback(out)
            except Exception:
                logger.exception("output callback for %s failed", out.request_id)


class EngineRunner:
    """Owns an Engine on one background thread; callers submit, abort and get outputs by callback.

    on_output runs on the engine thread, once per step that produced tokens for the request and
    exactly once with finished=True; it must not block. Given on_step instead, every step's
    outputs and the engine's stats go there (engine_process.py ships them to another process).
    """

    def __init__(self, args: EngineArgs, on_step: StepSink | None = None):
        self.engine = Engine(args)
        self._commands: queue.Queue = queue.Queue()
        self._router = OutputRouter()
        self._on_step = on_step or (lambda outputs, stats: self._router.deliver(outputs))
        self._stats = self.engine.stats()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dsa-engine", daemon=True)
        self._thread.start()

    def submit(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
               on_output: OutputCallback, priority: int = 0) -> None:
        """Queue a request; raises ValueError now for input that can never be served."""
        self.engine.limits.validate(prompt_token_ids, params)
        self._router.register(request_id, on_output)
        self.queue_request(request_id, prompt_token_ids, params, priority)

    def queue_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                      priority: int = 0) -> None:
        """Queue a request checked elsewhere: the engine answers bad input with an error output
        (to on_step, or to a callback submit registered)."""
        if self._stopping.is_set():
            raise RuntimeError("the engine is shutting down")
        self._commands.put(("add", request_id, list(prompt_token_ids), params, priority))

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def stats(self) -> dict[str, float]:
        return dict(self._stats)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """End every in-flight request with a final "abort" output and stop the thread."""
        self._stopping.set()
        self._commands.put(("wake",))
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.error("engine thread did not stop within %.1f s", timeout_s)

    def _loop(self) -> None:
        self.engine.make_current()
        while not self._stopping.is_set():
            self._drain_commands(block=not self.engine.has_work())
            if self._stopping.is_set():
                break
            try:
                outputs = self.engine.step()
            except Exception as exc:  # a failed step must not take the server down
                logger.exception("engine step failed")
                if self.engine.followers is not None:
                    # the other tensor-parallel ranks may wait in this step's collectives for good
                    logger.critical("a tensor-parallel step failed; the process exits so that the group restarts")
                    os._exit(1)
                outputs = self._fail_all(f"engine step failed: {type(exc).__name__}: {exc}")
            self._deliver(outputs)
        self._deliver([out for rid in list(self.engine.sequences) if (out := self.engine.abort(rid))])
        self.engine.close()

    def _drain_commands(self, block: bool) -> None:
        while True:
            try:
                command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
            except queue.Empty:
                return
            block = False
            if command[0] == "add":
                _, rid, ids, params, priority = command
                try:
                    self.engine.add_request(rid, ids, params, priority)
                except ValueError as exc:
                    self._deliver([error_output(rid, len(ids), str(exc))])
            elif command[0] == "abort":
                out = self.engine.abort(command[1])
                if out is not None:
                    self._deliver([out])

    def _fail_all(self, message: str) -> list[RequestOutput]:
        outputs = []
        for rid in list(self.engine.sequences):
            seq = self.engine.sequences[rid]
            self.engine.abort(rid)
            outputs.append(error_output(rid, len(seq.prompt_ids), message))
        return outputs

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        self._stats = self.engine.stats()   # replaced whole: readers on other threads see one step's
        try:
            self._on_step(outputs, self._stats)
        except Exception:
            logger.exception("delivering a step's outputs failed")
