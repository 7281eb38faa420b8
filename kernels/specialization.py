"""One compiled variant a kernel config, whatever the step. Triton compiles a kernel again for
each integer argument that turns 1, divisible by 16 or neither. A serving engine's context
lengths, logits widths, token counts and block-table widths change every step, so each first flip
stopped a decode step for a compile (H100, DeepSeek-V3.2 layers at batch 32: 2.5 s at the step
whose longest context reached 2128 tokens, against 29 ms; docs/PERFORMANCE.md, "Compiles in the
middle of serving"). Two measures:
- logits rows are padded to a multiple of ROW_ALIGN floats (logits_rows), so their stride, which
  the indexers write through and the top-k reads through, is always divisible: one variant, the
  one with aligned rows (the top-k was up to 3% faster with it at 32 rows of 128K keys);
- the kernels name in do_not_specialize the step-varying integers that only bound token masks or
  step through block tables a scalar at a time, and sparse MLA's split count, which only places a
  program's split (its batch-dependent split of 16 compiled the Gluon kernel again, 2 of its 23
  compiles over batches 1-48 on an H100). Those that bound a row's columns in the Triton
  indexers (max_len, num_k) stay specialized, not measured without: a divisible bound lets a
  masked store take several columns a thread."""

from __future__ import annotations

import torch

ROW_ALIGN = 16  # Triton's divisibility specialization


def logits_rows(rows: int, width: int, device: torch.device) -> torch.Tensor:
    """Uninitialized fp32 [rows, width] whose rows start every ROW_ALIGN floats."""
    padded = -(-width // ROW_ALIGN) * ROW_ALIGN
    return torch.empty_strided((rows, width), (padded, 1), device=device, dtype=torch.float32)
