"""An FP8 checkpoint served with fp8_weights=keep: the Triton parameter reaches the engine, whose
weights stay e4m3 (on the CPU the FP8 GEMMs run on their references), and the streamed text is
the offline LLM's on the same setting, which differs from the dequantized model's."""

from __future__ import annotations

from dsa_backend import LLM, SamplingParams
from dsa_client.grpc_stream import generate

from .servers import engine_kwargs

SERVER_CHECKPOINT = "glm_shared_fp8"
SERVER_SETTINGS = {"fp8_weights": "keep"}
PROMPT = "FP8 weights keep half the bytes, and the activations are rounded to e4m3 on the way in, so"


def test_kept_fp8_weights_serve_the_offline_llms_text(served, checkpoint):
    got = generate(served.grpc_url, PROMPT, 24, temperature=0.0, exclude_input_in_output=True, timeout_s=300)
    assert got.error is None and got.num_output_tokens == 24
    texts = {}
    for setting in ("keep", "dequantize"):
        llm = LLM(checkpoint(SERVER_CHECKPOINT), **engine_kwargs({**served.settings, "fp8_weights": setting}))
        texts[setting] = llm.generate(PROMPT, SamplingParams(max_tokens=24, temperature=0))[0].text
    assert got.text == texts["keep"]
    assert texts["keep"] != texts["dequantize"]  # so the text says which weights the server ran
