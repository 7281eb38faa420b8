"""postprocessing: the text delta of a detokenizer window; stateless, so any instance count works
(it remembers only when it last asked whether a stream was cancelled)."""

from __future__ import annotations

import logging
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from dsa_backend.serving import reply_layout, triton_io
from dsa_backend.serving.reply_text import client_outputs, strings
from dsa_backend.tokenizer import Tokenizer

logger = logging.getLogger("postprocessing")
# Asking the server whether a request was cancelled is a round trip to it, as long as the rest of
# a delta's work; under load a stream's deltas come every few milliseconds, and this one instance
# bounds how many deltas a second all streams get. So a stream is asked about at most this often:
# a cancelled stream's deltas keep coming until dsa_llm has aborted it, and the next one asked
# about after the cancel starts that.
_CANCEL_CHECK_INTERVAL_S = 0.05
_MAX_TRACKED_STREAMS = 4096


class TritonPythonModel:
    def initialize(self, args):
        self.tokenizer = Tokenizer(triton_io.model_parameters(args)["tokenizer_dir"])
        self.next_cancel_check: dict[str, float] = {}   # request id -> when to ask again

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                reply = reply_layout.unpack(triton_io.request_inputs(request))
                if self._cancel_check_due(reply.request_id, final=bool(reply.finish_reason)) and request.is_cancelled():
                    responses.append(self._cancelled(reply.request_id))
                    continue
                outputs = {name if name == "text_output" else f"out_{name}": value
                           for name, value in client_outputs(self.tokenizer, reply).items()}
                responses.append(triton_io.response(outputs))
            except Exception as e:     # never let an exception escape execute
                responses.append(triton_io.error_response(f"postprocessing failed: {type(e).__name__}: {e}"))
        return responses

    def _cancel_check_due(self, request_id: str, final: bool) -> bool:
        """Whether to ask now if this stream was cancelled: not at its last delta (dsa_llm's request
        has ended), else at its first and then every _CANCEL_CHECK_INTERVAL_S."""
        if final:
            self.next_cancel_check.pop(request_id, None)
            return False
        now = time.monotonic()
        if now < self.next_cancel_check.get(request_id, 0.0):
            return False
        if len(self.next_cancel_check) >= _MAX_TRACKED_STREAMS:   # streams whose last delta never came
            self.next_cancel_check = {k: t for k, t in self.next_cancel_check.items() if t > now - 60}
        self.next_cancel_check[request_id] = now + _CANCEL_CHECK_INTERVAL_S
        return True

    def _cancelled(self, request_id: str):
        """Tell dsa_llm to abort the engine request; Triton 2.51 does not pass the cancel on."""
        abort = pb_utils.Tensor("abort_request_id", np.array([[request_id.encode()]], dtype=np.object_))  # [batch, 1]
        try:
            for _ in pb_utils.InferenceRequest(model_name="dsa_llm", inputs=[abort],
                                               requested_output_names=[]).exec(decoupled=True):
                pass
        except Exception:
            logger.warning("postprocessing: aborting a cancelled request failed", exc_info=True)
        # An empty delta, not an error: after an error step a cancelled Triton 2.51 ensemble
        # request never completes, and server shutdown then waits out its exit timeout.
        return triton_io.response({"text_output": strings([""])})
