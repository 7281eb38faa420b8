"""Speculative decoding with the checkpoint's MTP (nextn) layer as the draft model."""

from dsa_backend.spec.config import SpecConfig

__all__ = ["SpecConfig"]
