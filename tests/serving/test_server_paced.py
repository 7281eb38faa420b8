"""max_responses_per_s: under the limit a stream's responses wait for their share of it and carry
every token made meanwhile; the text is the unpaced text, and its first and last responses do not wait."""

from __future__ import annotations

from dsa_client.grpc_stream import generate

from dsa_backend.sampling_params import SamplingParams

RATE = 10.0     # one stream alone: a response every 0.1 s
SERVER_SETTINGS = {"max_responses_per_s": str(RATE)}


def test_a_paced_stream_carries_the_unpaced_text_in_fewer_responses(served, offline_llm):
    prompt = "Pacing keeps the server's response rate within what it can take"
    c = generate(served.grpc_url, prompt, 80, temperature=0.0, exclude_input_in_output=True, timeout_s=120)
    assert c.error is None, c.error
    assert c.final and c.num_output_tokens == 80
    [offline] = offline_llm.generate(prompt, SamplingParams(max_tokens=80, temperature=0))
    assert c.text == offline.text
    # The first response goes at once, then at most one every 1 / RATE s (the last at once too).
    elapsed = c.times[-1] - c.times[0]
    assert len(c.times) <= 2 + elapsed * RATE * 1.2
    assert len(c.times) < 80
    # Arrival times carry the client's jitter (a late first response shortens the gap after it),
    # so the middle gap is what is held to the interval.
    gaps = sorted(b - a for a, b in zip(c.times[:-1], c.times[1:-1]))
    assert gaps and gaps[len(gaps) // 2] >= 0.8 / RATE, gaps
