"""dsa_llm: a decoupled python model that owns the dsa_backend engines, each in a process of its
own: one, or data_parallel_size replicas (dsa_backend/replicas.py; a request runs on one).

execute() only parses each request and hands it to the engine, as one engine request a sample
(n of them: SamplingParams.n, tensorrtllm_backend's num_return_sequences); a request that sent
text instead of token ids is tokenized on a pool of threads first, and gets text back (what the
ensemble's postprocessing would have sent, in the outputs it asked for). Responses are sent from
one sender thread as the engine produces tokens (one a sample for all the steps the thread has not
sent yet, paced by max_responses_per_s, each with its sequence_index), the last one with the FINAL
flag. Between outputs the same thread polls for
cancelled requests (aborting them in the engine) and refreshes the engine gauges: a response
sender must only be used by the thread that sends its FINAL response, since asking a finished
one is_cancelled() crashes the 2.51 server.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import triton_python_backend_utils as pb_utils

from dsa_backend.runner import error_output
from dsa_backend.engine_process import EngineProcess
from dsa_backend.replicas import Replicas
from dsa_backend.serving import engine_config, reply_layout, triton_io
from dsa_backend.serving.metrics import ServerMetrics
from dsa_backend.serving.prompt import tokenized
from dsa_backend.serving.reply_text import client_outputs
from dsa_backend.serving.request_params import parse_request
from dsa_backend.serving.response_stream import ResponseStream
from dsa_backend.tokenizer import Tokenizer

logger = logging.getLogger("dsa_llm")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
_POLL_INTERVAL_S = 0.1
# The thread that receives the engine's outputs and the sender thread share this process's GIL. At
# Python's default switch interval (5 ms) a thread that wants it back (the receiver when a step's
# outputs arrive, the sender after each message to the server) can wait that long for the other
# to yield it (docs/PERFORMANCE.md, "Serving: the engine against the served engine").
_GIL_SWITCH_INTERVAL_S = 0.0005
_TOKENIZER_THREADS = 4        # text requests tokenized at once (a 1K-token prompt: ~2-3 ms)


class _Active:
    """A request the engine holds: its response sender and each sample's stream state."""

    def __init__(self, sender, streams: list[ResponseStream], engine_ids: list[str], engine: EngineProcess,
                 text_outputs: frozenset[str] | None):
        self.sender = sender
        # A request that sent text gets text, in the outputs it asked for; one that sent token ids
        # (the ensemble's) gets the reply tensors postprocessing reads.
        self.text_outputs = text_outputs
        self.engine = engine                   # the replica that runs its samples
        self.streams = streams                 # by sample index
        self.engine_ids = engine_ids           # the engine's request a sample
        self.unfinished = set(range(len(streams)))
        self.cancelled = False
        self.error: str | None = None          # a sample's error: the others are aborted, the request fails
        self.unsent: list = []                 # (sample index, output, when made) its next responses carry
        self.last_sent = float("-inf")         # when its last response went out

    def abort_all(self) -> None:
        for index in list(self.unfinished):    # the sender thread may end one meanwhile
            self.engine.abort(self.engine_ids[index])


class Overloaded(ValueError):
    """A request refused because max_queued_requests are waiting already."""


class TritonPythonModel:
    def initialize(self, args):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        sys.setswitchinterval(_GIL_SWITCH_INTERVAL_S)
        params = triton_io.model_parameters(args)
        device = params.get("device", "auto")
        if args.get("model_instance_kind") == "GPU" and device == "auto":
            device = f"cuda:{args['model_instance_device_id']}"
        elif args.get("model_instance_kind") == "CPU" and device == "auto":
            device = "cpu"
        self.shutdown_timeout_s = float(params.get("shutdown_timeout_s", "10"))
        self.max_responses_per_s = engine_config.max_responses_per_s(params)
        self.max_queued_requests = engine_config.max_queued_requests(params)
        engine_args = engine_config.engine_args(params, device)     # ValueError naming a bad setting
        logger.info("dsa_llm: starting the engine with %s", engine_args)
        # The engines' steps must not share this process's GIL with the sender (engine_process.py).
        self.replicas = Replicas(engine_args, engine_config.data_parallel_size(params),
                                 engine_config.replica_routing(params))
        # The tests (and operators) read these lines to see where the engines really run.
        engines = self.replicas.engines
        for r, engine in enumerate(engines):
            replica = f" as replica {r} of {len(engines)}" if len(engines) > 1 else ""
            logger.info("dsa_llm: engine ready on device %s, dtype %s (instance kind %s)%s", engine.device,
                        engine.dtype, args.get("model_instance_kind"), replica)
        self.tokenizer = Tokenizer(engine_args.model)
        self.metrics = ServerMetrics(args["model_name"], args["model_version"], len(self.replicas.engines))
        self.active: dict[str, _Active] = {}
        self.num_streams = 0            # the unfinished samples of the requests in flight
        self.lock = threading.Lock()
        self.outputs: queue.Queue = queue.Queue()
        self.draining = threading.Event()
        self.tokenizing = ThreadPoolExecutor(_TOKENIZER_THREADS, thread_name_prefix="dsa_llm-tokenize")
        self.admitting = threading.Lock()      # requests reach the router and the engines one at a time
        self.sender_thread = threading.Thread(target=self._send_loop, name="dsa_llm-sender", daemon=True)
        self.sender_thread.start()

    def execute(self, requests):
        for request in requests:
            sender, arrived = request.get_response_sender(), time.monotonic()
            try:
                inputs = triton_io.request_inputs(request)
            except ValueError as e:
                self._send_error(sender, str(e))
                continue
            if "text_input" in inputs or "messages" in inputs:
                # Tokenizing a long prompt takes milliseconds: on this thread the requests behind
                # it would wait, so a pool does it (the tokenizer lets go of the GIL meanwhile).
                self.tokenizing.submit(self._serve, inputs, request.request_id(), sender, arrived,
                                       frozenset(request.requested_output_names()))
            else:
                self._serve(inputs, request.request_id(), sender, arrived, None)
        return None

    def _serve(self, inputs: dict, triton_id: str, sender, arrived: float,
               text_outputs: frozenset[str] | None) -> None:
        try:
            if text_outputs is not None:
                if "input_ids" in inputs or "bad_words_ids" in inputs:
                    raise ValueError("give the prompt as text_input (or messages) or as input_ids, not both; "
                                     "with text, bad words go in bad_words")
                inputs = {**inputs, **tokenized(self.tokenizer, inputs)}
            elif "bad_words" in inputs:
                raise ValueError("bad_words (strings) come with text_input or messages; with input_ids send "
                                 "bad_words_ids")
            with self.admitting:
                self._submit(inputs, triton_id, sender, arrived, text_outputs)
        except Overloaded as e:
            self._send_error(sender, str(e), finish_reason="rejected")
        except ValueError as e:
            self._send_error(sender, str(e))
        except Exception as e:     # an engine bug must not escape and hang the client
            logger.exception("dsa_llm: request failed")
            self._send_error(sender, f"internal error: {type(e).__name__}: {e}")

    def _submit(self, inputs: dict, triton_id: str, sender, arrived: float,
                text_outputs: frozenset[str] | None) -> None:
        if "abort_request_id" in inputs or "drain" in inputs:
            if "abort_request_id" in inputs:
                self._abort_for_peer(inputs["abort_request_id"][0].decode())
            if "drain" in inputs and inputs["drain"][0]:
                self._drain(sender)
            else:
                sender.send(flags=FINAL)
            return
        if self.draining.is_set():
            raise ValueError("the server is shutting down and takes no new requests")
        parsed = parse_request(inputs)
        self._refuse_when_the_queue_is_full()
        request_id = f"{triton_id or 'req'}-{uuid.uuid4().hex[:12]}"
        samples = parsed.params.samples()
        engine_ids = [request_id] if len(samples) == 1 else [f"{request_id}/{i}" for i in range(len(samples))]
        engine = self.replicas.choose(parsed.prompt_token_ids)
        active = _Active(sender, [ResponseStream(request_id, parsed, self.tokenizer, arrived, index=i)
                                  for i in range(len(samples))], engine_ids, engine, text_outputs)
        with self.lock:
            self.active[request_id] = active
            self.num_streams += len(samples)
        for index, (engine_id, params) in enumerate(zip(engine_ids, samples)):
            try:
                engine.submit(engine_id, parsed.prompt_token_ids, params,
                              lambda out, i=index: self.outputs.put((request_id, i, out, time.monotonic())),
                              parsed.priority)
            except Exception as e:
                # The sender thread owns this sender from now on, so it sends the error too: the
                # samples not submitted fail with it, and those submitted are aborted.
                message = str(e) if isinstance(e, ValueError) else f"internal error: {type(e).__name__}: {e}"
                for i in range(index):
                    engine.abort(engine_ids[i])
                for i in range(index, len(samples)):
                    failed = error_output(engine_ids[i], len(parsed.prompt_token_ids), message)
                    self.outputs.put((request_id, i, failed, time.monotonic()))
                return
        self.metrics.request_admitted(len(parsed.prompt_token_ids))

    def _abort_for_peer(self, request_id: str) -> None:
        # postprocessing saw the ensemble request cancelled; no more responses are wanted.
        with self.lock:
            active = self.active.get(request_id)
        if active is not None and not active.cancelled:
            active.cancelled = True
            logger.info("dsa_llm: %s cancelled by the client (through the ensemble)", request_id)
            active.abort_all()

    def _drain(self, sender) -> None:
        """Abort everything in flight; answer (FINAL) once every request has had its last response."""
        self.draining.set()
        with self.lock:
            request_ids = list(self.active)
        logger.info("dsa_llm: draining, ending %d requests in flight", len(request_ids))
        for request_id in request_ids:
            with self.lock:
                active = self.active.get(request_id)
            if active is not None:
                active.abort_all()

        def answer_when_idle():
            deadline = time.monotonic() + self.shutdown_timeout_s
            while self.active and time.monotonic() < deadline:
                time.sleep(0.02)
            sender.send(flags=FINAL)

        threading.Thread(target=answer_when_idle, name="dsa_llm-drain", daemon=True).start()

    def _send_loop(self) -> None:
        # Runs detokenization and IPC off the engine, in the order the engine produced. Each pass
        # takes everything queued and sends one response a request that is due: its first and
        # last outputs at once, others once its share of max_responses_per_s has passed since its
        # last response. Each response costs the server and postprocessing the same whatever it
        # carries, and a stream of more than they take queues there (docs/SERVING.md, "What serving
        # costs"); a response that waits carries every token made meanwhile.
        next_poll = time.monotonic()
        waiting: dict[str, _Active] = {}       # requests with outputs not yet sent
        stopping = False
        while not stopping:
            wake = min([next_poll, *(self._due(a) for a in waiting.values())])
            try:
                items = [self.outputs.get(timeout=max(wake - time.monotonic(), 0.0))]
            except queue.Empty:
                items = []
            while True:
                try:
                    items.append(self.outputs.get_nowait())
                except queue.Empty:
                    break
            if None in items:
                stopping, items = True, items[:items.index(None)]
            with self.lock:
                for request_id, index, out, made in items:
                    active = self.active.get(request_id)
                    if active is not None:
                        active.unsent.append((index, out, made))
                        waiting[request_id] = active
            now = time.monotonic()
            for request_id, active in list(waiting.items()):
                if stopping or any(out.finished for _, out, _ in active.unsent) or now >= self._due(active):
                    del waiting[request_id]
                    outs, active.unsent, active.last_sent = active.unsent, [], now
                    self._handle_outputs(request_id, active, outs)
            if time.monotonic() >= next_poll:
                self._poll()
                next_poll = time.monotonic() + _POLL_INTERVAL_S

    def _due(self, active: _Active) -> float:
        """When a request's next responses may go: its share of max_responses_per_s after its
        last, a share a sample."""
        if not self.max_responses_per_s:
            return active.last_sent
        return active.last_sent + self.num_streams / self.max_responses_per_s

    def _handle_outputs(self, request_id: str, active: _Active, outs: list) -> None:
        """Send one response a sample with outputs: the engine's outputs since the last, in order."""
        by_sample: dict[int, list] = {}
        for index, out, _ in outs:
            by_sample.setdefault(index, []).append(out)
        try:
            for index, sample_outs in by_sample.items():
                self._send_reply(request_id, active, index, sample_outs, outs[-1][2])
        except Exception:
            logger.exception("dsa_llm: sending a response for %s failed", request_id)
            active.abort_all()
            self._finish(request_id, active, None, "error")

    def _send_reply(self, request_id: str, active: _Active, index: int, outs: list, now: float) -> None:
        stream = active.streams[index]
        reply = stream.on_output(outs, now)
        if reply is None:
            return
        if stream.stopped_by_string and not outs[-1].finished:
            active.engine.abort(active.engine_ids[index])      # its text ended at a stop string
        reason = "error" if reply.error else (outs[-1].finish_reason or "stop") if reply.final else ""
        self.metrics.reply_sent(reply, reason)
        if reply.final:
            with self.lock:
                active.unfinished.discard(index)
                self.num_streams -= 1
        if reply.error and active.error is None:
            active.error = reply.error       # one sample failed: so does the request, once all have ended
            active.abort_all()
        if active.unfinished:
            if not (active.cancelled or active.error) and reply.fields is not None:
                active.sender.send(self._response(active, reply.fields))
            return
        if active.error:
            response = triton_io.error_response(active.error)
        elif active.cancelled or reply.fields is None:
            response = None
        else:
            response = self._response(active, reply.fields)
        # Refresh the gauges first, so a client that reads them after its last response sees the
        # pages of this request already freed.
        self.metrics.engine_stats(self.replicas.stats())
        self._finish(request_id, active, response, None)

    def _response(self, active: _Active, reply: reply_layout.ReplyFields):
        """The reply as its request wants it: in tensors for postprocessing, or as text (what
        postprocessing would have made of it)."""
        if active.text_outputs is None:
            return triton_io.response(reply_layout.pack(reply))
        return triton_io.response(client_outputs(self.tokenizer, reply, active.text_outputs))

    def _finish(self, request_id: str, active: _Active, response, error: str | None) -> None:
        with self.lock:
            if self.active.pop(request_id, None) is None:
                return
            self.num_streams -= len(active.unfinished)
        if error is not None:
            response = triton_io.error_response(error)
        try:
            if response is None:
                active.sender.send(flags=FINAL)
            else:
                active.sender.send(response, flags=FINAL)
        except Exception:
            logger.warning("dsa_llm: final response for %s could not be sent", request_id, exc_info=True)

    def _poll(self) -> None:
        with self.lock:
            items = list(self.active.items())
        for request_id, active in items:
            if not active.cancelled and active.sender.is_cancelled():
                active.cancelled = True
                logger.info("dsa_llm: %s cancelled by the client", request_id)
                active.abort_all()
        try:
            self.metrics.engine_stats(self.replicas.stats())
        except Exception:
            logger.warning("dsa_llm: reading engine stats failed", exc_info=True)

    def _refuse_when_the_queue_is_full(self) -> None:
        """max_queued_requests: a new request is refused while that many samples wait for the engine
        (in flight here and not in its running batch; the batch's size is the last step's)."""
        if self.max_queued_requests is None:
            return
        with self.lock:
            waiting = self.num_streams - sum(int(s.get("running", 0)) for s in self.replicas.stats())
        if waiting >= self.max_queued_requests:
            raise Overloaded(f"the server is overloaded: {waiting} requests wait for the engine "
                             f"(max_queued_requests={self.max_queued_requests}); retry later")

    def _send_error(self, sender, message: str, finish_reason: str = "error") -> None:
        self.metrics.request_finished(finish_reason)
        try:
            sender.send(triton_io.error_response(message), flags=FINAL)
        except Exception:
            logger.warning("dsa_llm: error response could not be sent: %s", message, exc_info=True)

    def finalize(self):
        # shutdown() ends every in-flight request with a final output, which the sender thread
        # turns into final responses before it stops.
        logger.info("dsa_llm: shutting down with %d requests in flight", len(self.active))
        self.tokenizing.shutdown(wait=True)     # what it holds still reaches the engine, and ends below
        self.replicas.shutdown(self.shutdown_timeout_s)
        self.outputs.put(None)
        self.sender_thread.join(self.shutdown_timeout_s)
        with self.lock:
            leftovers = list(self.active.items())
        for request_id, active in leftovers:
            self._finish(request_id, active, None, "server shutting down")

