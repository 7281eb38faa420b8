"""EngineProcess: the engine in a process of its own, behind EngineRunner's interface.

In one process the engine's thread shares the GIL with everything that serves its outputs: the
Triton stub's sender building and sending responses, its metric updates, the execute thread
parsing requests. Under load each waits for the other to yield it, and every step of the engine
gets longer (docs/PERFORMANCE.md, "Serving: the engine against the served engine"). Here a spawned
child runs an EngineRunner; requests and aborts go to it over a pipe, and each step's outputs come
back with the engine's stats as one message, which a receiver thread hands to the requests'
callbacks. Requests are validated here against the engine's limits, so bad input still fails at
submit. If the child dies, every request in flight ends with an error output and the child is
started again; if this process dies, the child sees its pipe close and shuts down.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from multiprocessing.connection import Connection

from dsa_backend.engine import EngineArgs, RequestOutput
from dsa_backend.runner import EngineRunner, OutputCallback, OutputRouter, error_output
from dsa_backend.sampling_params import SamplingParams

logger = logging.getLogger(__name__)
_LOG_FORMAT = "%(asctime)s %(processName)s %(name)s %(levelname)s %(message)s"
_EXIT_GRACE_S = 5.0
_CRASH_LOOP_S = 60.0


class EngineProcess:
    """An EngineRunner in a spawned child process: submit, abort, stats and shutdown as there.

    A child that dies is started again (in-flight requests end with an error, and requests are
    refused while it loads); one that dies again within _CRASH_LOOP_S of that restart is not, and
    every later request is refused with the reason. Triton 2.51 reports a python model ready even
    when its stub is dead, so a restart is what keeps a server that an orchestrator thinks
    healthy serving.
    """

    def __init__(self, args: EngineArgs):
        self._args = args
        self._router = OutputRouter()
        self._send_lock = threading.Lock()
        self._stopping = False
        self._refusal: str | None = None     # why submit refuses now: restarting, or given up
        self._last_restart = float("-inf")
        self._start()
        self._receiver = threading.Thread(target=self._receive, name="dsa-engine-receiver", daemon=True)
        self._receiver.start()

    def submit(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
               on_output: OutputCallback, priority: int = 0) -> None:
        """Queue a request; raises ValueError now for input that can never be served."""
        if self._refusal:
            raise RuntimeError(self._refusal)
        self.limits.validate(prompt_token_ids, params)
        self._router.register(request_id, on_output)
        try:
            self._send(("add", request_id, list(prompt_token_ids), params, priority))
        except RuntimeError:
            self._router.discard(request_id)
            raise

    def abort(self, request_id: str) -> None:
        self._send(("abort", request_id))

    def stats(self) -> dict[str, float]:
        return dict(self._stats)

    @property
    def num_in_flight(self) -> int:
        """Requests submitted here that have not had their final output."""
        return len(self._router)

    @property
    def refusal(self) -> str | None:
        """Why submit refuses requests now (the engine is restarting, or was given up), or None."""
        return self._refusal

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """End every in-flight request with a final "abort" output and stop the child."""
        self._stopping = True
        self._send(("shutdown", timeout_s))
        self._receiver.join(timeout_s + _EXIT_GRACE_S)
        self._process.join(_EXIT_GRACE_S)
        if self._process.is_alive():
            logger.error("the engine process did not stop within %.1f s; killing it", timeout_s + 2 * _EXIT_GRACE_S)
            self._process.kill()
            self._process.join(_EXIT_GRACE_S)

    def _start(self) -> None:
        """Spawn a child and wait until its engine is ready (loaded and warmed up)."""
        # spawn, not fork: this process has threads (Triton's, the stub's) and may hold CUDA state
        context = multiprocessing.get_context("spawn")
        conn, child_end = context.Pipe()
        process = context.Process(target=_serve, args=(child_end, self._args, logging.getLogger().getEffectiveLevel()),
                                  name="dsa-engine")
        process.start()
        child_end.close()
        with self._send_lock:
            self._conn, self._process = conn, process
        try:
            reply = conn.recv()
        except EOFError:
            process.join(_EXIT_GRACE_S)
            raise RuntimeError(f"the engine process exited with code {process.exitcode} while starting; "
                               "its log says why") from None
        if reply[0] == "failed":
            process.join(_EXIT_GRACE_S)
            _, is_value_error, message = reply
            raise (ValueError if is_value_error else RuntimeError)(message)
        _, self.limits, self.device, self.dtype, self._stats = reply

    def _send(self, command: tuple) -> None:
        try:
            with self._send_lock:
                self._conn.send(command)
        except OSError:     # the child is gone; the receiver ends what was in flight
            if command[0] == "add":
                raise RuntimeError(self._refusal or "the engine process has exited") from None

    def _receive(self) -> None:
        """Hand each step's outputs to their callbacks; when a child dies, restart it (or give up)."""
        while True:
            while True:
                try:
                    message = self._conn.recv()
                except (EOFError, OSError):
                    break
                if message[0] == "stopped":
                    break
                _, outputs, self._stats = message
                self._router.deliver(outputs)
            # The pipe closes before the process is gone, and a GPU process can take seconds to
            # tear down: refuse at once, so that Replicas sends new requests elsewhere meanwhile.
            self._refusal = self._refusal or "the engine process has exited"
            self._process.join(_EXIT_GRACE_S)
            exited = f"the engine process has exited (code {self._process.exitcode})"
            crash_loop = time.monotonic() - self._last_restart < _CRASH_LOOP_S
            self._refusal = (exited if self._stopping else
                             f"{exited} again within {_CRASH_LOOP_S:.0f} s of a restart; it is not restarted"
                             if crash_loop else f"{exited}; it is restarting")
            # what is still in flight will get no more outputs from that child
            orphans = self._router.in_flight()
            self._router.deliver([error_output(rid, 0, exited) for rid in orphans])
            if self._stopping:
                return
            logger.error("%s; %d requests in flight ended with an error", exited, len(orphans))
            if crash_loop:
                logger.error("%s; restart the server", self._refusal)
                return
            self._last_restart = time.monotonic()
            try:
                self._start()
            except Exception as exc:
                self._refusal = f"{exited}, and starting it again failed: {exc}"
                logger.error("%s", self._refusal)
                return
            logger.warning("the engine process was restarted")
            self._refusal = None
            if self._stopping:   # shutdown came while it started; this child gets it too
                self._send(("shutdown", _EXIT_GRACE_S))


def _serve(conn: Connection, args: EngineArgs, log_level: int) -> None:
    """The child: an EngineRunner whose steps go back over conn, fed with conn's commands."""
    logging.basicConfig(level=log_level, format=_LOG_FORMAT)
    send_lock = threading.Lock()

    def send(message: tuple) -> None:
        try:
            with send_lock:
                conn.send(message)
        except OSError:
            pass            # the serving process is gone; recv below sees it and shuts down

    last_stats: dict[str, float] = {}

    def on_step(outputs: list[RequestOutput], stats: dict[str, float]) -> None:
        nonlocal last_stats
        if outputs or stats != last_stats:
            send(("outputs", outputs, stats))
            last_stats = stats

    try:
        runner = EngineRunner(args, on_step=on_step)
    except Exception as exc:
        if not isinstance(exc, ValueError):  # a bad setting is the message; anything else needs its trace
            logger.exception("the engine failed to start")
        send(("failed", isinstance(exc, ValueError), str(exc)))
        return
    engine = runner.engine
    send(("ready", engine.limits, str(engine.device), str(engine.dtype).removeprefix("torch."), runner.stats()))
    while True:
        try:
            command = conn.recv()
        except (EOFError, OSError):
            logger.warning("the serving process is gone; shutting the engine down")
            command = ("shutdown", 10.0)
        if command[0] == "add":
            _, request_id, prompt_token_ids, params, priority = command
            try:
                runner.queue_request(request_id, prompt_token_ids, params, priority)   # checked there
            except RuntimeError as exc:   # this engine is shutting down
                on_step([error_output(request_id, len(prompt_token_ids), str(exc))], runner.stats())
        elif command[0] == "abort":
            runner.abort(command[1])
        elif command[0] == "shutdown":
            runner.shutdown(command[1])
            send(("stopped",))
            return
