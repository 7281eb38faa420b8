"""dsa-triton's engine: DeepSeek Sparse Attention models over paged KV pools."""

from dsa_backend.sampling_params import SamplingParams


def __getattr__(name: str):
    # LLM pulls in torch and the model; keep `import dsa_backend` light for the Triton models.
    if name == "LLM":
        from dsa_backend.llm import LLM

        return LLM
    raise AttributeError(name)


__all__ = ["LLM", "SamplingParams"]
