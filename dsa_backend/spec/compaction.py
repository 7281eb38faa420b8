"""After a tree verify: the accepted path moves to the front of the request's draft region.

Verify wrote node i's KV at position base + i (base: the root's position). The accepted path,
nodes a_1 < ... < a_k at depths 1..k, belongs at positions base + 1 .. base + k, where every later
step reads it as plain history: its KV moves there in every layer of both pools (target layers and
the MTP layer's, whose rows there the next draft-extend rewrites anyway), slot by slot, so any page
size works. The hidden states that draft-extend takes are the path's rows of the verify output
(the engine gathers them). A chain's path is already in place. (Only a chain hands the target's
top-k to draft-extend, so no top-k needs relabelling to the compacted positions.)
"""

from __future__ import annotations

import torch

from dsa_backend.batch import ForwardBatch
from dsa_backend.cache import KVCache


def compact_accepted_path(cache: KVCache, batch: ForwardBatch, request: int, base: int, path: list[int]) -> None:
    """Move the KV of accepted nodes path (node ids, root excluded) of batch row `request` to base + depth."""
    moved = [(depth, node) for depth, node in enumerate(path, 1) if node != depth]
    if not moved:
        return
    device = batch.block_table.device
    dst = torch.tensor([base + depth for depth, _ in moved], device=device)
    src = torch.tensor([base + node for _, node in moved], device=device)
    cache.move_kv_cache(batch.slots(request, dst), batch.slots(request, src))
