"""One dsa_llm request: engine outputs -> the replies to send, and its timings.

Streaming requests get one reply per engine step that produced tokens, or per several when the
sender is behind the engine (one reply covers every step since the last); the others get one
reply at the end. Each reply carries a detokenizer window, so that the stateless postprocessing
step (or dsa_llm itself, for a request that sent text) can cut the exact text delta out of it
(dsa_backend.serving.reply_layout.ReplyFields).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dsa_backend.detokenizer import IncrementalDetokenizer, TextWindow
from dsa_backend.engine import RequestOutput
from dsa_backend.serving.reply_layout import ReplyFields
from dsa_backend.serving.request_params import LLMRequest
from dsa_backend.tokenizer import Tokenizer


@dataclass(frozen=True)
class Reply:
    """One response to send: its fields (None for an error or nothing to send yet), whether it is
    the last, and timings."""

    fields: ReplyFields | None
    final: bool
    error: str | None = None
    new_tokens: int = 0
    ttft_s: float | None = None          # set on the step that produced the first token
    itl_s: float | None = None           # seconds per token since the previous reply's tokens
    # speculative decoding: draft tokens verified since the last reply, how many were accepted,
    # and each verify step's accept length (accepted + 1; a reply may cover several steps)
    new_draft_tokens: int = 0
    new_accepted_draft_tokens: int = 0
    accept_lengths: tuple[int, ...] = ()


class ResponseStream:
    def __init__(self, request_id: str, request: LLMRequest, tokenizer: Tokenizer, arrival: float, index: int = 0):
        """index: which of the request's n samples this stream carries (its sequence_index)."""
        p = request.params
        self.request_id = request_id
        self.index = index
        self.request = request
        self.tokenizer = tokenizer
        self.detok = IncrementalDetokenizer(tokenizer, stop=p.stop,
                                            include_stop_str_in_output=p.include_stop_str_in_output,
                                            skip_special_tokens=p.skip_special_tokens)
        self.arrival = arrival
        self.finished = False
        self._last_token_at: float | None = None
        self._logprobs: list[float] = []
        self._prompt_logprobs: list[float] = []   # until the reply that carries them
        self._top_logprobs: list[tuple[int, float]] = []   # (token id, log prob) pairs not sent yet
        self._cumulative_logprob = 0.0
        self.num_draft_tokens = 0              # cumulative, as the engine counts them
        self.num_accepted_draft_tokens = 0

    @property
    def stopped_by_string(self) -> bool:
        """A stop string ended the text before the engine finished: the engine must abort it."""
        return self.detok.stopped

    def on_output(self, outs: Sequence[RequestOutput], now: float) -> Reply | None:
        """Turn the engine's outputs for this request since the last reply (one or more steps',
        in order) into the one reply to send now, if any. Under load the sender falls behind the
        engine, and one response a step would only put it further behind."""
        if self.finished:
            return None
        error = next((o.error for o in outs if o.error), None)
        if error:
            self.finished = True
            return Reply(None, True, error=error)
        out = outs[-1]
        new_token_ids = [t for o in outs for t in o.new_token_ids]
        n = len(new_token_ids)
        ttft = now - self.arrival if n and self._last_token_at is None else None
        itl = (now - self._last_token_at) / n if n and self._last_token_at is not None else None
        if n:
            self._last_token_at = now
        new_logprobs = [lp for o in outs for lp in o.new_logprobs or ()]
        self._prompt_logprobs += [lp for o in outs for lp in (o.prompt_logprobs or [None])[1:]]
        self._top_logprobs += [pair for o in outs for top in o.new_top_logprobs or () for pair in top]
        self._logprobs += new_logprobs
        cumulative = [o.cumulative_logprob for o in outs if o.cumulative_logprob is not None]
        if cumulative:
            self._cumulative_logprob = cumulative[-1]
        spec = self._count_drafts(outs)
        window = self.detok.add(new_token_ids, finished=out.finished)
        self.finished = out.finished or self.detok.stopped
        reason = "stop" if self.detok.stopped else (out.finish_reason or "") if self.finished else ""
        if self.request.stream:
            logprobs = new_logprobs
        elif self.finished:
            window, logprobs = self._whole_text_window(), self._logprobs
        else:
            return Reply(None, False, new_tokens=n, ttft_s=ttft, itl_s=itl, **spec)
        fields = ReplyFields(
            window,
            counts={"num_input_tokens": out.num_prompt_tokens, "num_output_tokens": out.num_output_tokens,
                    "num_cached_tokens": out.num_cached_tokens,
                    "total_accepted_draft_tokens": self.num_accepted_draft_tokens,
                    "total_draft_tokens": self.num_draft_tokens,
                    "skip_special_tokens": int(self.detok.skip_special_tokens), "sequence_index": self.index},
            floats={"cum_log_probs": self._cumulative_logprob, "acceptance_rate": self.acceptance_rate},
            finish_reason=reason, request_id=self.request_id,
            log_probs=logprobs if self.request.params.logprobs else [],
            prompt_log_probs=self._prompt_logprobs, top_log_probs=self._top_logprobs)
        self._prompt_logprobs, self._top_logprobs = [], []
        return Reply(fields, self.finished, new_tokens=n, ttft_s=ttft, itl_s=itl, **spec)

    def _count_drafts(self, outs: Sequence[RequestOutput]) -> dict:
        """The drafts verified in these steps, how many were accepted, and each verify step's
        accept length (accepted + 1). The engine's counts are cumulative; an error output carries
        zeros, so the last seen is kept."""
        drafted = accepted = 0
        accept_lengths = []
        for o in outs:
            step_drafted = max(o.num_draft_tokens - self.num_draft_tokens, 0)
            step_accepted = max(o.num_accepted_draft_tokens - self.num_accepted_draft_tokens, 0)
            self.num_draft_tokens += step_drafted
            self.num_accepted_draft_tokens += step_accepted
            if step_drafted:
                accept_lengths.append(step_accepted + 1)
            drafted, accepted = drafted + step_drafted, accepted + step_accepted
        return {"new_draft_tokens": drafted, "new_accepted_draft_tokens": accepted,
                "accept_lengths": tuple(accept_lengths)}

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
