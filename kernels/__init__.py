"""DSA GPU kernels (import name `dsa_kernels`): Triton kernels, their PyTorch references, and the
dispatch layer that prefers DeepGEMM / FlashMLA where they load. Use the functions re-exported
here; `dsa_kernels.reference` holds the oracles and the score/top-k conventions."""

from .dispatch import (
    available_backends,
    calibrate_fp8_linear,
    expert_alignment,
    expert_runs,
    fp8_grouped_linear,
    fp8_linear,
    fp8_linear_quantized,
    paged_indexer_logits,
    quantize_act,
    ragged_indexer_logits,
    rms_norm,
    rope,
    route,
    silu_mul_quantize,
    sparse_mla_decode,
    sparse_mla_prefill,
    store_index_keys,
    store_mla_kv,
    sum_pairs,
    topk_transform,
)

__all__ = [
    "available_backends",
    "calibrate_fp8_linear",
    "expert_alignment",
    "expert_runs",
    "fp8_grouped_linear",
    "fp8_linear",
    "fp8_linear_quantized",
    "paged_indexer_logits",
    "quantize_act",
    "ragged_indexer_logits",
    "rms_norm",
    "rope",
    "route",
    "silu_mul_quantize",
    "sparse_mla_decode",
    "sparse_mla_prefill",
    "store_index_keys",
    "store_mla_kv",
    "sum_pairs",
    "topk_transform",
]
