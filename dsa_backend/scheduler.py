"""Continuous batching with chunked prefill, admission by free pages, retraction, abort.

Each step has a token budget. Running requests go first, in arrival order, each taking what it
still has to compute (one token when decoding, a chunk when prefilling); then waiting requests
are admitted in arrival order while the budget, the running cap and the free pages allow. A
waiting request that does not fit blocks those behind it (FIFO fairness). When a running request
needs a page and none is free, the most recently admitted request is retracted: its pages are
freed and it waits at the front to be recomputed (prompt and output so far) later.
With speculative decoding, a decoding request also carries its draft tokens: they take budget and
pages like real tokens, and are dropped (decode goes on without them) when the budget is short.
With prefix caching, an admitted request starts after the longest run of whole pages of its
tokens that is cached (cache/prefix_cache.py), and every page a running request fills is cached
as soon as its tokens are known; cached pages nobody holds count as free and are evicted on demand.
A waiting request whose prompt's next pages are being computed by a running request (the n
samples of one prompt, a burst of requests behind one long system prompt) waits for them to be
cached instead of computing them a second time, when they are at least half of what it has left
to compute; it does not block the requests behind it.
Priorities (a lower number first, 0 by default, as vLLM's): requests wait in priority order, then
arrival; running requests take the budget in priority order; the request retracted for pages is
the lowest-priority one, the newest among those; and a waiting request that outranks a running
one but finds no running slot or not enough free pages for its first chunk (after its cached
prefix) retracts running requests of lower priority, lowest and newest first, until it can start.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from dsa_backend.cache.allocator import PageAllocator, pages_needed
from dsa_backend.cache.prefix_cache import PrefixCache, page_keys
from dsa_backend.sequence import Sequence, SequenceStatus
from dsa_backend.spec.tree import DraftTree


@dataclass(frozen=True)
class ScheduledChunk:
    seq: Sequence
    start: int        # first token position computed in this step
    num_tokens: int   # tokens of the sequence computed in this step
    draft: DraftTree | None = None  # draft tokens verified after them (speculative decoding)

    @property
    def num_drafts(self) -> int:
        return self.draft.num_drafts if self.draft else 0

    @property
    def completes(self) -> bool:
        """Whether this chunk reaches the sequence's last token, so its logits are sampled."""
        return self.start + self.num_tokens == self.seq.num_tokens


class Scheduler:
    def __init__(self, allocator: PageAllocator, page_size: int, max_running: int, max_batched_tokens: int,
                 prefix_caching: bool = False):
        self.pages = PrefixCache(allocator, enabled=prefix_caching)
        self.page_size = page_size
        self.max_running = max_running
        self.max_batched_tokens = max_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_retractions = 0
        self.num_cached_tokens = 0  # prompt (and recomputed output) tokens found in the cache at admission
        self._computing: dict[bytes, Sequence] = {}  # page key -> the running request computing it

    def add(self, seq: Sequence) -> None:
        """Queue behind every waiting request of its priority or a higher one."""
        if not self.waiting or self.waiting[-1].priority <= seq.priority:
            self.waiting.append(seq)   # the common case, without a scan
        else:
            self._insert_before(seq, lambda w: w.priority > seq.priority)

    def _requeue(self, seq: Sequence) -> None:
        """Queue a request that ran before at the front of its priority."""
        if not self.waiting or self.waiting[0].priority >= seq.priority:
            self.waiting.appendleft(seq)
        else:
            self._insert_before(seq, lambda w: w.priority >= seq.priority)

    def _insert_before(self, seq: Sequence, first_after) -> None:
        self.waiting.insert(next((i for i, w in enumerate(self.waiting) if first_after(w)), len(self.waiting)), seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledChunk]:
        budget = self.max_batched_tokens
        chunks: list[ScheduledChunk] = []
        if self.pages.enabled:
            for seq in self.running:
                self._cache_full_pages(seq)
        self._make_room_for_priority()
        for seq in sorted(self.running, key=lambda s: s.priority):
            if budget == 0:
                break
            if seq not in self.running:  # retracted while making room for an earlier one
                continue
            if seq.output_is_complete:  # its last token is on its way back (overlap scheduling)
                continue
            n = min(seq.num_uncomputed, budget)
            if seq.draft and (n != seq.num_uncomputed or n + seq.draft.num_drafts > budget):
                seq.draft = None
            chunk = ScheduledChunk(seq, seq.num_computed, n, seq.draft)
            # a tree's nodes take consecutive slots after the root, as a chain's tokens do
            if not self._grow(seq, seq.num_computed + n + chunk.num_drafts, protect={c.seq for c in chunks}):
                continue
            chunks.append(chunk)
            budget -= n + chunk.num_drafts
        deferred = []    # waiting for their pages to be computed by running requests
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            seq = self.waiting.popleft()
            self._match_prefix(seq)
            if self._computed_by_others(seq):
                self._release(seq)  # hold no pages while waiting
                seq.num_computed = 0
                deferred.append(seq)
                continue
            n = min(seq.num_uncomputed, budget)
            if pages_needed(seq.num_computed + n, self.page_size) - len(seq.pages) > self.pages.num_available:
                self._release(seq)
                seq.num_computed = 0
                self.waiting.appendleft(seq)
                break
            self.num_cached_tokens += seq.num_computed
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = seq.num_computed
            self._grow(seq, seq.num_computed + n, protect=set())
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._claim_pages(seq)
            chunks.append(ScheduledChunk(seq, seq.num_computed, n))
            budget -= n
        self.waiting.extendleft(reversed(deferred))
        return chunks

    def reserve(self, seq: Sequence, num_tokens: int) -> bool:
        """Pages for num_tokens of a running request if they are free now, without retracting."""
        need = pages_needed(num_tokens, self.page_size) - len(seq.pages)
        if need > 0:
            if need > self.pages.num_available:
                return False
            seq.pages.extend(self.pages.allocate(need))
        return True

    def _grow(self, seq: Sequence, num_tokens: int, protect: set[Sequence]) -> bool:
        """Give seq pages for num_tokens, retracting later requests if needed; False if seq itself went."""
        need = pages_needed(num_tokens, self.page_size) - len(seq.pages)
        while need > 0 and need > self.pages.num_available:
            victim = max((s for s in self.running if s not in protect), key=_retraction_order)
            self.retract(victim)
            if victim is seq:
                return False
        if need > 0:
            seq.pages.extend(self.pages.allocate(need))
        return True

    def retract(self, seq: Sequence) -> None:
        """Free a running request's pages (cached ones stay cached); it is recomputed when readmitted."""
        self.running.remove(seq)
        self._release(seq)
        seq.num_computed = 0
        seq.draft = None
        seq.status = SequenceStatus.WAITING
        self._requeue(seq)
        self.num_retractions += 1

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a request wherever it is and free its pages."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._release(seq)
        seq.pending_rows = []  # tokens sampled after the end are dropped
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def _make_room_for_priority(self) -> None:
        """Retract running requests that the first waiting request outranks, lowest priority and
        newest first, while it finds no running slot or too few free pages for its first chunk."""
        while self.waiting and self.running:
            head = self.waiting[0]
            victim = max(self.running, key=_retraction_order)
            if victim.priority <= head.priority or (
                    len(self.running) < self.max_running and self._pages_to_start(head) <= self.pages.num_available):
                return
            self.retract(victim)

    def _pages_to_start(self, seq: Sequence) -> int:
        """Of the available pages, how many a waiting request takes to start: its first chunk's
        new pages after the cached prefix it would match, and the cached pages of that prefix that
        nobody holds (available until it holds them)."""
        cached, unheld = self.pages.peek(self._usable_prefix(seq))
        first_chunk = min(seq.num_tokens - cached * self.page_size, self.max_batched_tokens)
        return pages_needed(first_chunk, self.page_size) + unheld

    def _match_prefix(self, seq: Sequence) -> None:
        """Start a waiting request after its cached prefix."""
        if not self.pages.enabled:
            return
        seq.pages = self.pages.match(self._usable_prefix(seq))
        seq.num_held_pages = len(seq.pages)
        seq.num_computed = seq.num_held_pages * self.page_size

    def _usable_prefix(self, seq: Sequence) -> list[bytes]:
        """The keys of the pages a waiting request may take from the cache: its last token is
        always computed (its logits are sampled)."""
        if not self.pages.enabled:
            return []
        usable = self._known_pages(seq, seq.num_tokens - 1)
        if seq.prompt_logprobs_left:
            # a prompt token's logprob comes from the position before it, which the cache skips
            usable = min(usable, seq.num_prompt_logprobs // self.page_size)
        return seq.page_keys[:usable]

    def _computed_by_others(self, seq: Sequence) -> bool:
        """Whether the pages right after seq's cached prefix are being computed by running
        requests, and they are at least half of what seq has left to compute."""
        if not self.pages.enabled or seq.prompt_logprobs_left:
            return False
        # One look-up: a key names its whole prefix, and a request computes its pages in order
        # after the cached ones (which seq has matched too), so if the page that makes up half of
        # seq's remaining tokens is being computed, so is every page before it.
        half = seq.num_held_pages + -(-seq.num_uncomputed // (2 * self.page_size)) - 1
        if half >= self._known_pages(seq, seq.num_tokens - 1):
            return False
        owner = self._computing.get(seq.page_keys[half])
        return owner is not None and owner is not seq and owner.status is SequenceStatus.RUNNING

    def _claim_pages(self, seq: Sequence) -> None:
        """Note the whole pages of known tokens a newly running request is about to compute."""
        if self.pages.enabled:
            for key in seq.page_keys[seq.num_held_pages:self._known_pages(seq, seq.num_tokens)]:
                self._computing.setdefault(key, seq)

    def _cache_full_pages(self, seq: Sequence) -> None:
        """Cache the request's pages whose every token has its KV written."""
        full = self._known_pages(seq, seq.num_computed)
        if full > seq.num_held_pages:
            seq.num_held_pages = self.pages.insert(seq.pages, seq.num_held_pages, seq.page_keys[:full])

    def _known_pages(self, seq: Sequence, num_tokens: int) -> int:
        """How many whole pages of seq's first num_tokens tokens hold known ids (not the unread
        ones of overlap scheduling); seq.page_keys has their keys, each computed once."""
        have = len(seq.page_keys)
        want = min(num_tokens, len(seq.prompt_ids) + len(seq.output_ids)) // self.page_size
        if want > have:
            seq.page_keys += page_keys(seq.token_ids(have * self.page_size, want * self.page_size), self.page_size,
                                       seq.page_keys[-1] if have else b"")
        return want

    def _release(self, seq: Sequence) -> None:
        if self.pages.enabled and seq.status is SequenceStatus.RUNNING:
            self._cache_full_pages(seq)
            for key in seq.page_keys:
                if self._computing.get(key) is seq:
                    del self._computing[key]
        self.pages.release(seq.pages, seq.num_held_pages)
        seq.pages = []
        seq.num_held_pages = 0


def _retraction_order(seq: Sequence) -> tuple[int, int]:
    """The request retracted first is the largest: the lowest priority, then the newest."""
    return seq.priority, seq.arrival
