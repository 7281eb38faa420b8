"""postprocessing: the text delta of a detokenizer window; stateless, so any instance count works."""

from __future__ import annotations

import logging

import numpy as np
import triton_python_backend_utils as pb_utils

from dsa_backend.detokenizer import TextWindow, window_text
from dsa_backend.serving import triton_io
from dsa_backend.tokenizer import Tokenizer

logger = logging.getLogger("postprocessing")
PASS_THROUGH = ("cum_log_probs", "output_log_probs", "finish_reason", "num_input_tokens", "num_output_tokens",
                "num_cached_tokens", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")


class TritonPythonModel:
    def initialize(self, args):
        self.tokenizer = Tokenizer(triton_io.model_parameters(args)["tokenizer_dir"])

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                inputs = triton_io.request_inputs(request)
                if request.is_cancelled():
                    responses.append(self._cancelled(inputs))
                    continue
                window = TextWindow(inputs["token_window"].tolist(), int(inputs["text_start"][0]),
                                    int(inputs["text_end"][0]))
                skip = bool(inputs["skip_special_tokens"][0]) if "skip_special_tokens" in inputs else True
                outputs = {"text_output": triton_io.strings([window_text(self.tokenizer, window, skip)])}
                outputs.update({f"out_{name}": inputs[name] for name in PASS_THROUGH if name in inputs})
                responses.append(triton_io.response(outputs))
            except Exception as e:     # never let an exception escape execute
                responses.append(triton_io.error_response(f"postprocessing failed: {type(e).__name__}: {e}"))
        return responses

    def _cancelled(self, inputs):
        """Tell dsa_llm to abort the engine request; Triton 2.51 does not pass the cancel on."""
        if "request_id" in inputs:
            abort = pb_utils.Tensor("abort_request_id", np.array([inputs["request_id"]], dtype=np.object_))
            try:
                for _ in pb_utils.InferenceRequest(model_name="dsa_llm", inputs=[abort],
                                                   requested_output_names=[]).exec(decoupled=True):
                    pass
            except Exception:
                logger.warning("postprocessing: aborting a cancelled request failed", exc_info=True)
        # An empty delta, not an error: after an error step a cancelled Triton 2.51 ensemble
        # request never completes, and server shutdown then waits out its exit timeout.
        return triton_io.response({"text_output": triton_io.strings([""])})
