"""Test helpers: tiny checkpoint specs, random prompts, and dequantized copies for transformers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from dsa_backend.weights import SafetensorsCheckpoint, dequantize_fp8_block

CHECKPOINTS = {
    "deepseek_v32": dict(arch="deepseek_v32"),
    "glm_moe_dsa": dict(arch="glm_moe_dsa"),
    # layers F S F S: full iff max(i - 1 + 1, 0) % 2 == 0
    "glm_shared_freq": dict(arch="glm_moe_dsa", index_topk_freq=2, index_skip_topk_offset=1),
    "glm_shared_pattern": dict(arch="glm_moe_dsa", index_topk_pattern="FSSF"),
    "deepseek_v32_fp8": dict(arch="deepseek_v32", fp8=True),
    # GLM-5 with shared top-k layers (F S F S), FP8
    "glm_shared_fp8": dict(arch="glm_moe_dsa", index_topk_freq=2, index_skip_topk_offset=1, fp8=True),
}


def dequantized_copy(src: Path, dst: Path) -> Path:
    """A float32 copy of an FP8 checkpoint, without quantization_config, for transformers."""
    ckpt = SafetensorsCheckpoint(src)
    cfg = json.loads((src / "config.json").read_text())
    block = tuple(cfg.pop("quantization_config")["weight_block_size"])
    tensors = {}
    for name in ckpt.names():
        if name.endswith("_scale_inv"):
            continue
        t = ckpt.get(name)
        if name + "_scale_inv" in ckpt.names():
            t = dequantize_fp8_block(t, ckpt.get(name + "_scale_inv"), block)
        tensors[name] = t.float().contiguous()
    dst.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(src / f, dst / f)
    return dst


def random_prompts(lengths, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    # Ids below the tokenizer's vocabulary, avoiding bos/eos.
    return [torch.randint(2, 128000, (n,), generator=gen).tolist() for n in lengths]
