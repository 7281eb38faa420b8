"""Speculative decoding settings, checked at start-up."""

from __future__ import annotations

from dataclasses import dataclass

ALGORITHMS = ("mtp", "eagle")  # eagle: the same MTP layer, drafting EAGLE-style from its own hidden
MAX_TOPK = 16
# The default verified tree size: every drafted level could be verified in full (1 + num_steps *
# topk), but verify cost grows with it and the best few nodes carry most of the acceptance.
DEFAULT_MAX_DRAFT_TOKENS = 32


@dataclass(frozen=True)
class SpecConfig:
    """num_steps draft levels per request per step, topk children per expanded node.

    topk 1 drafts a chain; topk > 1 a tree (EAGLE): num_draft_tokens is the verified size, the
    root (last verified token) plus the num_draft_tokens - 1 best drafted nodes. Defaults to
    num_steps + 1 for a chain and min(1 + num_steps * topk, 32) for a tree.
    reuse_topk (chains only, see reuses_topk): the MTP layer takes the target's top-k in
    draft-extend and each draft step the previous step's.
    """

    algorithm: str = "mtp"
    num_steps: int = 1
    topk: int = 1
    num_draft_tokens: int | None = None
    reuse_topk: bool = True

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"speculative_algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if not isinstance(self.num_steps, int) or not 1 <= self.num_steps <= 16:
            raise ValueError(f"speculative_num_steps must be in [1, 16], got {self.num_steps!r}")
        if not isinstance(self.topk, int) or not 1 <= self.topk <= MAX_TOPK:
            raise ValueError(f"speculative_eagle_topk must be in [1, {MAX_TOPK}], got {self.topk!r}")
        most = 1 + self.num_steps * self.topk
        if self.num_draft_tokens is None:
            object.__setattr__(self, "num_draft_tokens", min(most, DEFAULT_MAX_DRAFT_TOKENS))
        elif self.is_chain and self.num_draft_tokens != most:
            raise ValueError(f"speculative_num_draft_tokens must be speculative_num_steps + 1 = {most} for chain "
                             f"drafting (speculative_eagle_topk 1), got {self.num_draft_tokens}")
        elif not isinstance(self.num_draft_tokens, int) or not 2 <= self.num_draft_tokens <= most:
            raise ValueError(f"speculative_num_draft_tokens must be in [2, 1 + speculative_num_steps * "
                             f"speculative_eagle_topk] = [2, {most}] for tree drafting, got {self.num_draft_tokens!r}")

    @property
    def is_chain(self) -> bool:
        return self.topk == 1

    @property
    def reuses_topk(self) -> bool:
        """Whether the MTP layer reuses top-k rather than running its own indexer. Only a chain's
        rows each continue the row before them; a tree's draft steps rank each node's own visible
        keys with the MTP indexer, whose keys for verified positions draft-extend must then write."""
        return self.reuse_topk and self.is_chain

    @property
    def lookahead(self) -> int:
        """KV slots a step may write past a request's last token: the verified drafts, and the MTP
        rows of the draft steps (topk per step after the first, each in its own slot)."""
        return max(self.num_draft_tokens - 1, self.topk * (self.num_steps - 1))
