"""One dsa_llm request: engine outputs -> the replies sent to postprocessing, and its timings.

Streaming requests get one reply per engine step that produced tokens; the others get one reply at
the end. Each reply carries a detokenizer window (token_window, text_start, text_end) so that the
stateless postprocessing step can cut the exact text delta out of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsa_backend.detokenizer import IncrementalDetokenizer, TextWindow
from dsa_backend.serving.request_params import LLMRequest
from dsa_backend.tokenizer import Tokenizer


@dataclass(frozen=True)
class Reply:
    """One response to send: outputs (None for an error), whether it is the last, and timings."""

    outputs: dict[str, np.ndarray] | None
    final: bool
    error: str | None = None
    new_tokens: int = 0
    ttft_s: float | None = None          # set on the step that produced the first token
    itl_s: float | None = None           # seconds per token since the previous step's tokens
    # speculative decoding: draft tokens verified in this engine step, and how many were accepted
    new_draft_tokens: int = 0
    new_accepted_draft_tokens: int = 0


class ResponseStream:
    def __init__(self, request_id: str, request: LLMRequest, tokenizer: Tokenizer, arrival: float):
        p = request.params
        self.request_id = request_id
        self.request = request
        self.tokenizer = tokenizer
        self.detok = IncrementalDetokenizer(tokenizer, stop=p.stop,
                                            include_stop_str_in_output=p.include_stop_str_in_output,
                                            skip_special_tokens=p.skip_special_tokens)
        self.arrival = arrival
        self.finished = False
        self._last_token_at: float | None = None
        self._logprobs: list[float] = []
        self._cumulative_logprob = 0.0
        self.num_draft_tokens = 0              # cumulative, as the engine counts them
        self.num_accepted_draft_tokens = 0

    @property
    def stopped_by_string(self) -> bool:
        """A stop string ended the text before the engine finished: the engine must abort it."""
        return self.detok.stopped

    def on_output(self, out, now: float) -> Reply | None:
        """Turn one RequestOutput into the reply to send now, if any."""
        if self.finished:
            return None
        if out.error:
            self.finished = True
            return Reply(None, True, error=out.error)
        n = len(out.new_token_ids)
        ttft = now - self.arrival if n and self._last_token_at is None else None
        itl = (now - self._last_token_at) / n if n and self._last_token_at is not None else None
        if n:
            self._last_token_at = now
        if out.new_logprobs:
            self._logprobs += out.new_logprobs
        if out.cumulative_logprob is not None:
            self._cumulative_logprob = out.cumulative_logprob
        # The engine's counts are cumulative (an error output carries zeros: keep the last seen).
        drafted = max(out.num_draft_tokens - self.num_draft_tokens, 0)
        accepted = max(out.num_accepted_draft_tokens - self.num_accepted_draft_tokens, 0)
        self.num_draft_tokens += drafted
        self.num_accepted_draft_tokens += accepted
        spec = {"new_draft_tokens": drafted, "new_accepted_draft_tokens": accepted}
        window = self.detok.add(out.new_token_ids, finished=out.finished)
        self.finished = out.finished or self.detok.stopped
        reason = "stop" if self.detok.stopped else (out.finish_reason or "") if self.finished else ""
        if self.request.stream:
            logprobs = out.new_logprobs or []
        elif self.finished:
            window, logprobs = self._whole_text_window(), self._logprobs
        else:
            return Reply(None, False, new_tokens=n, ttft_s=ttft, itl_s=itl, **spec)
        outputs = {
            "token_window": np.array(window.token_ids, dtype=np.int32),
            "text_start": np.array([window.text_start], dtype=np.int32),
            "text_end": np.array([window.text_end], dtype=np.int32),
            "cum_log_probs": np.array([self._cumulative_logprob], dtype=np.float32),
            "output_log_probs": np.array(logprobs if self.request.params.logprobs else [], dtype=np.float32),
            "finish_reason": np.array([reason.encode()], dtype=np.object_),
            "num_input_tokens": np.array([out.num_prompt_tokens], dtype=np.int32),
            "num_output_tokens": np.array([out.num_output_tokens], dtype=np.int32),
            "num_cached_tokens": np.array([out.num_cached_tokens], dtype=np.int32),
            "acceptance_rate": np.array([self.acceptance_rate], dtype=np.float32),
            "total_accepted_draft_tokens": np.array([self.num_accepted_draft_tokens], dtype=np.int32),
            "total_draft_tokens": np.array([self.num_draft_tokens], dtype=np.int32),
            "skip_special_tokens": np.array([self.detok.skip_special_tokens]),
            "request_id": np.array([self.request_id.encode()], dtype=np.object_),
        }
        return Reply(outputs, self.finished, new_tokens=n, ttft_s=ttft, itl_s=itl, **spec)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens so far; 0 when nothing was drafted (speculation off)."""
        return self.num_accepted_draft_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    def _whole_text_window(self) -> TextWindow:
        # The emitted text is a prefix of decode(output ids): it is cut only at a stop string.
        output_ids, text = self.detok.token_ids, self.detok.text
        if self.request.exclude_input_in_output:
            return TextWindow(output_ids, 0, len(text))
        ids = self.request.prompt_token_ids + output_ids
        held_back = len(self.tokenizer.decode(output_ids, self.detok.skip_special_tokens)) - len(text)
        full = self.tokenizer.decode(ids, self.detok.skip_special_tokens)
        return TextWindow(ids, 0, len(full) - held_back)
