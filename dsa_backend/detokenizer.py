"""Incremental detokenization that a stateless step can replay, with stop strings.

Decoding each new token alone loses leading spaces (SentencePiece-style decoders strip them) and
splits multi-byte characters. So, as vLLM and mini-sglang do, each delta is cut out of the decode
of a short token window that starts at the previously emitted tokens (the prefix, for context):

    delta = decode(window)[text_start:text_end]

`IncrementalDetokenizer` (one per request, in the model that owns the request) chooses the window
and the character range; `window_text` is the whole of what a stateless postprocessing step does.
The range stops before a trailing U+FFFD (an incomplete UTF-8 character) and before any text that
may be the start of a stop string, and the held-back text is sent once it is settled. The deltas
concatenate exactly to the decode of all output tokens (cut at a stop string, if one matched).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


@dataclass(frozen=True)
class TextWindow:
    """Tokens to decode and the character range of the decoded text that is the delta."""

    token_ids: list[int]
    text_start: int
    text_end: int


def window_text(decoder: Decoder, window: TextWindow, skip_special_tokens: bool = True) -> str:
    """The delta a window stands for: a pure function of its arguments."""
    if window.text_end <= window.text_start:
        return ""
    return decoder.decode(window.token_ids, skip_special_tokens)[window.text_start:window.text_end]


class IncrementalDetokenizer:
    """Turns one request's output tokens, as they arrive, into text windows."""

    def __init__(self, decoder: Decoder, stop: Sequence[str] = (), include_stop_str_in_output: bool = False,
                 skip_special_tokens: bool = True):
        self.decoder = decoder
        self.stop = tuple(stop)
        self.include_stop_str_in_output = include_stop_str_in_output
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self.text = ""                # everything emitted so far
        self.stopped = False          # a stop string matched; the request's text is complete
        self._prefix_offset = 0       # first token of the next window
        self._read_offset = 0         # tokens before this are fully emitted, ending on a clean boundary
        self._emitted = 0             # characters of decode(token_ids[_prefix_offset:]) already emitted

    def add(self, new_token_ids: Sequence[int], finished: bool) -> TextWindow:
        """Take a step's new tokens; return the window whose text is the newly settled delta.

        With `finished`, everything left is flushed (a trailing U+FFFD included). Once a stop
        string has matched, `stopped` is set and later calls return empty windows.
        """
        if self.stopped:
            return TextWindow([], 0, 0)
        self.token_ids.extend(new_token_ids)
        window = self.token_ids[self._prefix_offset:]
        full = self.decoder.decode(window, self.skip_special_tokens)
        end = len(full)
        match = self._find_stop(full)
        if match is not None:
            end = match
            self.stopped = True
        elif not finished:
            end = self._settled_end(full)
        end = max(end, self._emitted)
        result = TextWindow(window, self._emitted, end)
        self.text += full[self._emitted:end]
        self._emitted = end
        if end == len(full) and not full.endswith(REPLACEMENT_CHAR):
            self._advance(len(self.token_ids))
        return result

    def _find_stop(self, full: str) -> int | None:
        # Text before _emitted was checked already and held nothing that could start a stop string.
        best: int | None = None
        for s in self.stop:
            at = full.find(s, self._emitted)
            if at >= 0:
                end = at + len(s) if self.include_stop_str_in_output else at
                best = end if best is None else min(best, end)
        return best

    def _settled_end(self, full: str) -> int:
        end = len(full)
        while end > self._emitted and full[end - 1] == REPLACEMENT_CHAR:
            end -= 1
        for keep in range(min(max((len(s) for s in self.stop), default=1) - 1, end - self._emitted), 0, -1):
            tail = full[end - keep:end]
            if any(s.startswith(tail) for s in self.stop):
                return end - keep
        return end

    def _advance(self, read_offset: int) -> None:
        # Everything up to read_offset is emitted; the next window starts at the previous read
        # offset so that the newest emitted tokens stay as decoding context.
        dropped = self.token_ids[self._prefix_offset:self._read_offset]
        if dropped:
            self._emitted -= len(self.decoder.decode(dropped, self.skip_special_tokens))
        self._prefix_offset, self._read_offset = self._read_offset, read_offset
