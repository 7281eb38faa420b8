"""Speculative decoding settings, checked at start-up."""

from __future__ import annotations

from dataclasses import dataclass

ALGORITHMS = ("mtp", "eagle")  # eagle: the same MTP layer, drafting EAGLE-style from its own hidden


@dataclass(frozen=True)
class SpecConfig:
    """num_steps draft tokens per request per step, chained (topk 1).

    num_draft_tokens is the verified length (num_steps + 1 for a chain). reuse_topk: the MTP layer
    takes the target's top-k in draft-extend and each draft step the previous step's (valid only
    for chains, where every row continues the row before it).
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
        if self.topk != 1:
            raise ValueError(f"speculative_eagle_topk={self.topk}: tree drafting (topk > 1) is not "
                             "implemented yet; use topk 1 (chain drafting)")
        if self.num_draft_tokens is not None and self.num_draft_tokens != self.num_steps + 1:
            raise ValueError(f"speculative_num_draft_tokens must be num_steps + 1 = {self.num_steps + 1} "
                             f"for chain drafting, got {self.num_draft_tokens}")
