"""postprocessing: the text delta of a detokenizer window; stateless, so any instance count works."""

from __future__ import annotations

from dsa_backend.detokenizer import TextWindow, window_text
from dsa_backend.serving import triton_io
from dsa_backend.tokenizer import Tokenizer

PASS_THROUGH = ("cum_log_probs", "output_log_probs", "finish_reason", "num_input_tokens", "num_output_tokens")


class TritonPythonModel:
    def initialize(self, args):
        self.tokenizer = Tokenizer(triton_io.model_parameters(args)["tokenizer_dir"])

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                inputs = triton_io.request_inputs(request)
                window = TextWindow(inputs["token_window"].tolist(), int(inputs["text_start"][0]),
                                    int(inputs["text_end"][0]))
                skip = bool(inputs["skip_special_tokens"][0]) if "skip_special_tokens" in inputs else True
                outputs = {"text_output": triton_io.strings([window_text(self.tokenizer, window, skip)])}
                outputs.update({f"out_{name}": inputs[name] for name in PASS_THROUGH if name in inputs})
                responses.append(triton_io.response(outputs))
            except Exception as e:     # never let an exception escape execute
                responses.append(triton_io.error_response(f"postprocessing failed: {type(e).__name__}: {e}"))
        return responses
