"""postprocessing: the text delta of a detokenizer window; stateless, so any instance count works."""

from __future__ import annotations

import logging

import numpy as np
import triton_python_backend_utils as pb_utils

from dsa_backend.detokenizer import window_text
from dsa_backend.serving import reply_layout, triton_io
from dsa_backend.tokenizer import Tokenizer

logger = logging.getLogger("postprocessing")


class TritonPythonModel:
    def initialize(self, args):
        self.tokenizer = Tokenizer(triton_io.model_parameters(args)["tokenizer_dir"])

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                window, fields, request_id = reply_layout.unpack(triton_io.request_inputs(request))
                if request.is_cancelled():
                    responses.append(self._cancelled(request_id))
                    continue
                skip = bool(fields.pop("skip_special_tokens")[0])
                outputs = {"text_output": triton_io.strings([window_text(self.tokenizer, window, skip)])}
                outputs.update({f"out_{name}": value for name, value in fields.items()})
                responses.append(triton_io.response(outputs))
            except Exception as e:     # never let an exception escape execute
                responses.append(triton_io.error_response(f"postprocessing failed: {type(e).__name__}: {e}"))
        return responses

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
        return triton_io.response({"text_output": triton_io.strings([""])})
