"""preprocessing: text_input (or chat `messages`) -> input_ids, bad_words -> bad_words_ids."""

from __future__ import annotations

from dsa_backend.serving import triton_io
from dsa_backend.serving.prompt import tokenized
from dsa_backend.tokenizer import Tokenizer

# The ensemble passes every input it gets (config.pbtxt says why); these are the ones read.
_READ = ("text_input", "messages", "bad_words")


class TritonPythonModel:
    def initialize(self, args):
        self.tokenizer = Tokenizer(triton_io.model_parameters(args)["tokenizer_dir"])

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                inputs = triton_io.request_inputs(request, only=_READ)
                responses.append(triton_io.response(tokenized(self.tokenizer, inputs)))
            except ValueError as e:
                responses.append(triton_io.error_response(str(e)))
            except Exception as e:     # never let an exception escape execute
                responses.append(triton_io.error_response(f"preprocessing failed: {type(e).__name__}: {e}"))
        return responses
