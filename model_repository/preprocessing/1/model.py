"""preprocessing: text_input (or chat `messages`) -> input_ids, bad_words -> bad_words_ids."""

from __future__ import annotations

import numpy as np

from dsa_backend.serving import triton_io
from dsa_backend.serving.prompt import bad_words_ids, prompt_token_ids
from dsa_backend.tokenizer import Tokenizer


class TritonPythonModel:
    def initialize(self, args):
        self.tokenizer = Tokenizer(triton_io.model_parameters(args)["tokenizer_dir"])

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                inputs = triton_io.request_inputs(request)
                ids = prompt_token_ids(self.tokenizer, inputs.get("text_input"), inputs.get("messages"))
                outputs = {"input_ids": np.array(ids, dtype=np.int32),
                           "bad_words_ids": bad_words_ids(self.tokenizer, inputs.get("bad_words"))}
                responses.append(triton_io.response(outputs))
            except ValueError as e:
                responses.append(triton_io.error_response(str(e)))
            except Exception as e:     # never let an exception escape execute
                responses.append(triton_io.error_response(f"preprocessing failed: {type(e).__name__}: {e}"))
        return responses
