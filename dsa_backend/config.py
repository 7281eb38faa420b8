"""config.json -> ModelConfig for DeepseekV32ForCausalLM and GlmMoeDsaForCausalLM.

The checkpoint's raw config.json is the source of truth: transformers' config classes drop or
rewrite fields the DSA path needs (qk_rope_head_dim, index_topk_freq, ...), so those are read raw
and derived values (qk_head_dim) recomputed. Every invalid setting fails here, naming its field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ARCHITECTURES = {
    # architecture -> whether the indexer's RoPE is interleaved (GLM) or half-split (V3.2)
    "DeepseekV32ForCausalLM": False,
    "GlmMoeDsaForCausalLM": True,
}
# SGLang's original rule counted from layer 1, which is offset 2; transformers' GLM config agrees.
DEFAULT_SKIP_TOPK_OFFSET = 2


class ConfigError(ValueError):
    """A checkpoint's config.json is invalid or unsupported; the message names the field."""


@dataclass(frozen=True)
class IndexerLayerPlan:
    """Whether a layer runs its own indexer, and whether it hands its top-k to the next layer."""

    full: bool
    next_skip_topk: bool

    @property
    def skip_topk(self) -> bool:
        return not self.full


@dataclass(frozen=True)
class RopeConfig:
    """RoPE over the first `dim` dims of q/k, optionally YaRN-scaled (as transformers computes it)."""

    theta: float
    dim: int
    yarn_factor: float | None = None
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def inv_freq_and_attention_factor(self) -> tuple["torch.Tensor", float]:
        """Inverse frequencies [dim / 2] float32 and the factor applied to cos/sin."""
        import torch

        exponents = torch.arange(0, self.dim, 2, dtype=torch.int64, device="cpu").float() / self.dim
        pos_freqs = self.theta**exponents
        if self.yarn_factor is None:
            return 1.0 / pos_freqs, 1.0
        factor = self.yarn_factor
        if self.mscale and self.mscale_all_dim:
            attention_factor = _yarn_mscale(factor, self.mscale) / _yarn_mscale(factor, self.mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)

        def correction_dim(rotations: float) -> float:
            return (self.dim * math.log(self.original_max_position_embeddings / (rotations * 2 * math.pi))) / (
                2 * math.log(self.theta))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, self.dim - 1)
        if low == high:
            high += 0.001  # avoid a zero-width ramp
        ramp = ((torch.arange(self.dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
        extrapolation = 1 - ramp
        inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
        return inv_freq, float(attention_factor)

    def softmax_mscale(self) -> float:
        """Extra factor on the attention softmax scale (DeepSeek's mscale_all_dim, squared)."""
        if self.yarn_factor is None or not self.mscale_all_dim:
            return 1.0
        return _yarn_mscale(self.yarn_factor, self.mscale_all_dim) ** 2


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class Fp8BlockConfig:
    """FP8 e4m3 weights with one float32 `weight_scale_inv` per block."""

    block: tuple[int, int] = (128, 128)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    first_k_dense_replace: int
    rms_norm_eps: float
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    indexer_rope_interleaved: bool
    indexer_plan: tuple[IndexerLayerPlan, ...]
    rope: RopeConfig
    max_position_embeddings: int
    num_nextn_predict_layers: int
    quantization: Fp8BlockConfig | None
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    torch_dtype: str

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_cache_dim(self) -> int:
        """Width of one token's MLA latent cache entry: compressed kv then rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        return self.qk_head_dim**-0.5 * self.rope.softmax_mscale()

    @property
    def full_indexer_layers(self) -> tuple[int, ...]:
        return tuple(i for i, p in enumerate(self.indexer_plan) if p.full)

    def is_moe_layer(self, layer_id: int) -> bool:
        return layer_id >= self.first_k_dense_replace

    def sharded(self, size: int) -> "ModelConfig":
        """A rank's sizes among `size` tensor-parallel ranks (dsa_backend/parallel.py): its share of
        the attention heads and of every MLP's hidden units."""
        fields = ["num_attention_heads", "moe_intermediate_size"]
        fields += ["intermediate_size"] if self.first_k_dense_replace else []
        for field in fields:
            if getattr(self, field) % size:
                raise ConfigError(f"{field} ({getattr(self, field)}) is not divisible by tensor_parallel_size ({size})")
        return replace(self, num_attention_heads=self.num_attention_heads // size,
                       moe_intermediate_size=self.moe_intermediate_size // size,
                       intermediate_size=self.intermediate_size // size if self.first_k_dense_replace
                       else self.intermediate_size)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> "ModelConfig":
        """Read `model_dir/config.json` (raw and through transformers) and validate it."""
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ConfigError(f"no config.json in {model_dir}")
        raw = json.loads(path.read_text(encoding="utf-8"))
        return cls.from_dict(_merge_with_transformers(model_dir, raw))

    @classmethod
    def from_dict(cls, cfg: dict) -> "ModelConfig":
        """Build and validate from a config.json-style dict."""
        archs = cfg.get("architectures") or []
        if len(archs) != 1 or archs[0] not in ARCHITECTURES:
            raise ConfigError(f"architectures must be one of {sorted(ARCHITECTURES)}, got {archs}")
        arch = archs[0]
        num_layers = _positive(cfg, "num_hidden_layers")
        if cfg.get("q_lora_rank") is None:
            raise ConfigError("q_lora_rank must be set: the DSA indexer reads the q_lora activations")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act must be 'silu', got {cfg['hidden_act']!r}")
        n_experts, n_group = _positive(cfg, "n_routed_experts"), _positive(cfg, "n_group", 1)
        if n_experts % n_group:
            raise ConfigError(f"n_routed_experts ({n_experts}) must be divisible by n_group ({n_group})")
        topk_group = _positive(cfg, "topk_group", 1)
        if topk_group > n_group:
            raise ConfigError(f"topk_group ({topk_group}) must be <= n_group ({n_group})")
        experts_per_tok = _positive(cfg, "num_experts_per_tok")
        if experts_per_tok > topk_group * (n_experts // n_group):
            raise ConfigError(f"num_experts_per_tok ({experts_per_tok}) exceeds the experts in topk_group groups")
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        rope_dim = _positive(cfg, "qk_rope_head_dim")
        index_head_dim = _positive(cfg, "index_head_dim", 128)
        if rope_dim > index_head_dim:
            raise ConfigError(f"qk_rope_head_dim ({rope_dim}) must be <= index_head_dim ({index_head_dim})")
        nextn = cfg.get("num_nextn_predict_layers", 0) or 0
        if not isinstance(nextn, int) or nextn < 0:
            raise ConfigError(f"num_nextn_predict_layers must be an integer >= 0, got {nextn!r}")
        return cls(
            architecture=arch,
            vocab_size=_positive(cfg, "vocab_size"),
            hidden_size=_positive(cfg, "hidden_size"),
            intermediate_size=_positive(cfg, "intermediate_size"),
            moe_intermediate_size=_positive(cfg, "moe_intermediate_size"),
            num_hidden_layers=num_layers,
            num_attention_heads=_positive(cfg, "num_attention_heads"),
            q_lora_rank=_positive(cfg, "q_lora_rank"),
            kv_lora_rank=_positive(cfg, "kv_lora_rank"),
            qk_nope_head_dim=_positive(cfg, "qk_nope_head_dim"),
            qk_rope_head_dim=rope_dim,
            v_head_dim=_positive(cfg, "v_head_dim"),
            n_routed_experts=n_experts,
            n_shared_experts=int(cfg.get("n_shared_experts") or 0),
            num_experts_per_tok=experts_per_tok,
            n_group=n_group,
            topk_group=topk_group,
            norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
            routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
            first_k_dense_replace=int(cfg.get("first_k_dense_replace", 0)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            index_n_heads=_positive(cfg, "index_n_heads"),
            index_head_dim=index_head_dim,
            index_topk=_positive(cfg, "index_topk"),
            indexer_rope_interleaved=ARCHITECTURES[arch],
            indexer_plan=indexer_plan(cfg, num_layers),
            rope=rope_config(cfg, rope_dim),
            max_position_embeddings=_positive(cfg, "max_position_embeddings"),
            num_nextn_predict_layers=nextn,
            quantization=fp8_config(cfg.get("quantization_config")),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
        )


def indexer_plan(cfg: dict, num_layers: int) -> tuple[IndexerLayerPlan, ...]:
    """Per-layer full/shared indexer plan (DESIGN.md: indexer_types, pattern, then freq/offset)."""
    full = _full_layers(cfg, num_layers)
    if not full[0]:
        raise ConfigError("layer 0 must run its own indexer (a shared layer has no top-k to reuse)")
    return tuple(
        IndexerLayerPlan(full=full[i], next_skip_topk=i + 1 < num_layers and not full[i + 1])
        for i in range(num_layers)
    )


def _full_layers(cfg: dict, num_layers: int) -> list[bool]:
    if cfg.get("indexer_types") is not None:
        types = list(cfg["indexer_types"])
        bad = [t for t in types if t not in ("full", "shared")]
        if bad:
            raise ConfigError(f"indexer_types entries must be 'full' or 'shared', got {bad[0]!r}")
        _check_length("indexer_types", types, num_layers)
        return [t == "full" for t in types]
    pattern = cfg.get("index_topk_pattern")
    if pattern is not None:
        marks = list(pattern)
        bad = [m for m in marks if m not in ("F", "S")]
        if bad:
            raise ConfigError(f"index_topk_pattern must contain only 'F' and 'S', got {bad[0]!r}")
        _check_length("index_topk_pattern", marks, num_layers)
        if marks[0] != "F":
            raise ConfigError("index_topk_pattern must start with 'F': layer 0 has no top-k to reuse")
        return [m == "F" for m in marks]
    freq = cfg.get("index_topk_freq", 1)
    if freq is None:
        freq = 1
    if not isinstance(freq, int) or freq < 1:
        raise ConfigError(f"index_topk_freq must be an integer >= 1, got {freq!r}")
    offset = cfg.get("index_skip_topk_offset")
    if offset is None:
        offset = DEFAULT_SKIP_TOPK_OFFSET
    elif not isinstance(offset, int) or offset <= 0:
        raise ConfigError(
            f"index_skip_topk_offset must be a positive integer, got {offset!r}: "
            "offset <= 0 would make layer 0 reuse a top-k that does not exist")
    return [max(i - offset + 1, 0) % freq == 0 for i in range(num_layers)]


def _check_length(field: str, values: list, num_layers: int) -> None:
    if len(values) != num_layers:
        raise ConfigError(f"{field} has {len(values)} entries but num_hidden_layers is {num_layers}")


def rope_config(cfg: dict, rope_dim: int) -> RopeConfig:
    """RoPE settings from rope_scaling (or transformers' rope_parameters)."""
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    theta = float(cfg.get("rope_theta") or scaling.get("rope_theta") or 10000.0)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return RopeConfig(theta=theta, dim=rope_dim)
    if kind != "yarn":
        raise ConfigError(f"rope_scaling.type must be 'yarn' or absent, got {kind!r}")
    factor = scaling.get("factor")
    if not isinstance(factor, (int, float)) or factor < 1:
        raise ConfigError(f"rope_scaling.factor must be a number >= 1, got {factor!r}")
    original = scaling.get("original_max_position_embeddings")
    if not isinstance(original, int) or original <= 0:
        raise ConfigError(f"rope_scaling.original_max_position_embeddings must be a positive integer, got {original!r}")
    return RopeConfig(
        theta=theta, dim=rope_dim, yarn_factor=float(factor), original_max_position_embeddings=original,
        beta_fast=float(scaling.get("beta_fast") or 32), beta_slow=float(scaling.get("beta_slow") or 1),
        mscale=scaling.get("mscale"), mscale_all_dim=scaling.get("mscale_all_dim"),
        truncate=bool(scaling.get("truncate", True)),
    )


def fp8_config(qcfg: dict | None) -> Fp8BlockConfig | None:
    """Validate quantization_config; only FP8 e4m3 with 128x128 weight blocks is supported."""
    if not qcfg:
        return None
    if qcfg.get("quant_method") != "fp8":
        raise ConfigError(f"quantization_config.quant_method must be 'fp8', got {qcfg.get('quant_method')!r}")
    if qcfg.get("fmt", "e4m3") != "e4m3":
        raise ConfigError(f"quantization_config.fmt must be 'e4m3', got {qcfg.get('fmt')!r}")
    block = qcfg.get("weight_block_size")
    if list(block or []) != [128, 128]:
        raise ConfigError(f"quantization_config.weight_block_size must be [128, 128], got {block!r}")
    if qcfg.get("activation_scheme", "dynamic") != "dynamic":
        raise ConfigError("quantization_config.activation_scheme must be 'dynamic'")
    return Fp8BlockConfig(block=(128, 128))


def _positive(cfg: dict, key: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    return value


def _merge_with_transformers(model_dir: str | Path, raw: dict) -> dict:
    """transformers' view of the config for defaults, with every raw field restored over it."""
    if raw.get("architectures", [None])[0] not in ARCHITECTURES:
        return raw  # from_dict names the bad architecture
    from transformers import AutoConfig

    merged = {**AutoConfig.from_pretrained(str(model_dir)).to_dict(), **raw}
    if "indexer_types" not in raw:
        merged.pop("indexer_types", None)  # transformers derives it; the raw schedule fields rule
    return merged
