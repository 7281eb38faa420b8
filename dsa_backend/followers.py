"""Followers: the tensor-parallel ranks after the first, each an Engine in a process of its own.

Rank 0's Engine (in the caller's process: LLM, EngineRunner, EngineProcess's child) spawns them.
Each follower builds the same Engine on its own GPU, with its shard of the weights, and then makes
the calls rank 0 makes (add_request, abort, step), in the same order, as rank 0 sends them. Every
rank therefore schedules the same batches, samples the same tokens (the same seeds, and the same
logits: the head runs on the all-reduced hidden state) and meets the others in the same
collectives; only rank 0's outputs leave the engine.

A rank that dies leaves the others waiting in a collective that never completes. So when a
follower exits unasked, rank 0's process exits too (code 1, after logging which rank), and a
follower exits when rank 0's process is gone; under EngineProcess the requests in flight then end
with an error and the whole group is started again. While the engines are being built, rank 0
first waits a little: a bad setting fails every rank alike, and rank 0 then raises its own error
(and stops the followers) rather than exit with a follower's.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import threading
import time
from multiprocessing.connection import Connection, wait

logger = logging.getLogger(__name__)
_LOG_FORMAT = "%(asctime)s %(processName)s %(name)s %(levelname)s %(message)s"
_EXIT_GRACE_S = 10.0
_PARENT_POLL_S = 1.0
_START_GRACE_S = 15.0


class Followers:
    """Ranks 1 .. size - 1 of args.tensor_parallel_size, meeting rank 0 on localhost:port."""

    def __init__(self, args, port: int):
        context = multiprocessing.get_context("spawn")   # this process may hold CUDA state
        self._conns: list[Connection] = []
        self._processes = []
        self._closing = False
        self._closed = threading.Event()
        self._started = False
        try:
            for rank in range(1, args.tensor_parallel_size):
                conn, child_end = context.Pipe()
                process = context.Process(target=_follow, name=f"dsa-engine-rank{rank}", daemon=True,
                                          args=(child_end, args, rank, port, logging.getLogger().getEffectiveLevel()))
                process.start()
                child_end.close()
                self._conns.append(conn)
                self._processes.append(process)
        except BaseException:
            self.close()    # the ones started would wait for the rest at the rendezvous
            raise
        threading.Thread(target=self._watch, name="dsa-followers-watch", daemon=True).start()
        atexit.register(self.close)   # before multiprocessing's own exit handler ends them

    def repeat(self, method: str, *args) -> None:
        """Have every follower call its Engine's `method` with args (sent now, run in order)."""
        for conn in self._conns:
            conn.send((method, args))

    def started(self) -> None:
        """Rank 0's engine is built: from now on a follower's exit ends rank 0's process at once."""
        self._started = True

    def ask_to_close(self) -> None:
        """Tell the followers to close their engines and exit (close() waits for them)."""
        if self._closing:
            return
        self._closing = True
        self._closed.set()
        for conn in self._conns:
            try:
                conn.send(("close", ()))
            except OSError:
                pass

    def close(self) -> None:
        """Stop the followers (their engines end with their processes); each gets _EXIT_GRACE_S."""
        self.ask_to_close()
        for process in self._processes:
            process.join(_EXIT_GRACE_S)
            if process.is_alive():
                process.kill()

    def _watch(self) -> None:
        ended = wait([p.sentinel for p in self._processes])
        if self._closing or (not self._started and self._closed.wait(_START_GRACE_S)):
            return
        process = next(p for p in self._processes if p.sentinel in ended)
        process.join()
        logger.critical("tensor-parallel %s exited with code %s; the other ranks would wait for it forever, "
                        "so this process exits too", process.name, process.exitcode)
        os._exit(1)


def _follow(conn: Connection, args, rank: int, port: int, log_level: int) -> None:
    """A follower: join the group, build this rank's Engine, then make rank 0's calls until told
    to close or until rank 0's process is gone."""
    from dsa_backend.engine import Engine
    from dsa_backend.parallel import join_group

    logging.basicConfig(level=log_level, format=_LOG_FORMAT)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), name="dsa-follower-watch", daemon=True).start()
    engine = Engine(args, tp=join_group(rank, args.tensor_parallel_size, port, args.rank_device(rank)))
    while True:
        try:
            method, call_args = conn.recv()
        except (EOFError, OSError):
            return
        if method == "close":
            engine.close()
            return
        getattr(engine, method)(*call_args)


def _exit_with_parent(parent: int) -> None:
    """Exit when rank 0's process is gone, even from inside a collective that waits for it."""
    while os.getppid() == parent:
        time.sleep(_PARENT_POLL_S)
    os._exit(1)
