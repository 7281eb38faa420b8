"""dsa-triton's engine: DeepSeek Sparse Attention models over paged KV pools."""

from dsa_backend.sampling_params import SamplingParams

__all__ = ["SamplingParams"]
