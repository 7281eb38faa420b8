"""Load a sharded safetensors DSA checkpoint into the model's parameter names.

Checkpoint names follow the Hugging Face releases (per-expert tensors, the MTP layer at index
num_hidden_layers); the model stacks experts ([E, 2I, H] gate+up, [E, H, I] down), the
attention's projections of one input (`stacked_projections`) and each dense MLP's gate and up
(`GATE_UP`), and keeps the MTP layer under `mtp.{j}`. FP8 block weights are either kept in e4m3
with their weight_scale_inv beside them (`keep_fp8`, for dsa_backend/models/fp8_linear.py) or
dequantized at load. Every missing, unexpected or mis-shaped tensor is an error that names it.
Under tensor parallelism each rank reads its share of the split tensors (`split_dim`; which ones
and why: dsa_backend/parallel.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from dsa_backend.config import ModelConfig
from dsa_backend.parallel import TensorParallel
from dsa_kernels.reference import dequantize_weight_ref


class WeightError(ValueError):
    """A checkpoint's tensors do not match its config; the message names the tensor."""


@dataclass(frozen=True)
class CheckpointInfo:
    """What the checkpoint holds beyond what its config says."""

    mtp_has_indexer: bool


def stacked_projections(c: ModelConfig, has_indexer: bool) -> dict[str, tuple[tuple[str, int], ...]]:
    """The linear layers an attention layer runs as one GEMM of their shared input (models/mla.py):
    stacked name -> its parts (checkpoint name under self_attn., rows) in row order. From x: q_a,
    the indexer's key and kv_a; from q_lora: the attention's and the indexer's query heads. In the
    releases every part but the last ends on a 128-row block, so the stacked FP8 scales keep them."""
    index_k = (("indexer.wk", c.index_head_dim),) if has_indexer else ()
    index_q = (("indexer.wq_b", c.index_n_heads * c.index_head_dim),) if has_indexer else ()
    return {
        "qkv_a_proj": (("q_a_proj", c.q_lora_rank), *index_k,
                       ("kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim)),
        "q_heads_proj": (("q_b_proj", c.num_attention_heads * c.qk_head_dim), *index_q),
    }


# A dense MLP's (or the shared experts') gate and up read the same input: one GEMM, rows [gate | up]
GATE_UP = ("gate_up_proj", ("gate_proj", "up_proj"))


def _indexer_shapes(prefix: str, c: ModelConfig) -> dict[str, tuple[int, ...]]:
    p = prefix + "self_attn.indexer."
    return {
        p + "wq_b.weight": (c.index_n_heads * c.index_head_dim, c.q_lora_rank),
        p + "wk.weight": (c.index_head_dim, c.hidden_size),
        p + "k_norm.weight": (c.index_head_dim,),
        p + "k_norm.bias": (c.index_head_dim,),
        p + "weights_proj.weight": (c.index_n_heads, c.hidden_size),
    }


def _decoder_layer_shapes(prefix: str, c: ModelConfig, moe: bool, indexer: bool) -> dict[str, tuple[int, ...]]:
    h, heads = c.hidden_size, c.num_attention_heads
    a = prefix + "self_attn."
    shapes = {
        prefix + "input_layernorm.weight": (h,),
        prefix + "post_attention_layernorm.weight": (h,),
        a + "q_a_proj.weight": (c.q_lora_rank, h),
        a + "q_a_layernorm.weight": (c.q_lora_rank,),
        a + "q_b_proj.weight": (heads * c.qk_head_dim, c.q_lora_rank),
        a + "kv_a_proj_with_mqa.weight": (c.kv_lora_rank + c.qk_rope_head_dim, h),
        a + "kv_a_layernorm.weight": (c.kv_lora_rank,),
        a + "kv_b_proj.weight": (heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank),
        a + "o_proj.weight": (h, heads * c.v_head_dim),
    }
    if indexer:
        shapes.update(_indexer_shapes(prefix, c))
    m = prefix + "mlp."
    if not moe:
        return {**shapes, **_mlp_shapes(m, h, c.intermediate_size)}
    shapes[m + "gate.weight"] = (c.n_routed_experts, h)
    shapes[m + "gate.e_score_correction_bias"] = (c.n_routed_experts,)
    for e in range(c.n_routed_experts):
        shapes.update(_mlp_shapes(f"{m}experts.{e}.", h, c.moe_intermediate_size))
    if c.n_shared_experts:
        shapes.update(_mlp_shapes(m + "shared_experts.", h, c.moe_intermediate_size * c.n_shared_experts))
    return shapes


def _mlp_shapes(prefix: str, hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
    return {prefix + "gate_proj.weight": (inter, hidden), prefix + "up_proj.weight": (inter, hidden),
            prefix + "down_proj.weight": (hidden, inter)}


def checkpoint_tensor_shapes(c: ModelConfig, mtp_has_indexer: bool = True) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of this config holds (unquantized names), with its shape.

    The MTP layer's own embed_tokens / shared_head.head copies are optional and not listed.
    """
    shapes = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size),
              "model.norm.weight": (c.hidden_size,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    for i in range(c.num_hidden_layers):
        shapes.update(_decoder_layer_shapes(f"model.layers.{i}.", c, c.is_moe_layer(i), c.indexer_plan[i].full))
    for j in range(c.num_nextn_predict_layers):
        p = f"model.layers.{c.num_hidden_layers + j}."
        shapes.update({p + "enorm.weight": (c.hidden_size,), p + "hnorm.weight": (c.hidden_size,),
                       p + "eh_proj.weight": (c.hidden_size, 2 * c.hidden_size),
                       p + "shared_head.norm.weight": (c.hidden_size,)})
        shapes.update(_decoder_layer_shapes(p, c, moe=True, indexer=mtp_has_indexer))
    return shapes


def quantize_fp8_block(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (e4m3 [N, K], weight_scale_inv [ceil(N/bn), ceil(K/bk)] float32), w ~ fp8 * scale."""
    bn, bk = block
    n, k = w.shape
    padded = torch.zeros(-(-n // bn) * bn, -(-k // bk) * bk, dtype=torch.float32)
    padded[:n, :k] = w.float()
    tiles = padded.view(padded.shape[0] // bn, bn, padded.shape[1] // bk, bk)
    scale = tiles.abs().amax(dim=(1, 3)).clamp_min(1e-12) / 448.0
    q = (tiles / scale[:, None, :, None]).clamp(-448, 448).view_as(padded)[:n, :k]
    return q.to(torch.float8_e4m3fn).contiguous(), scale


def dequantize_fp8_block(w: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """Inverse of quantize_fp8_block, in float32."""
    return dequantize_weight_ref(w, _checked_scale("weight", w.shape, scale_inv, block))


# Tensor-parallel splits (checkpoint names): the attention's per-head projections and every MLP's
# gate and up by rows, their outputs (o_proj, down) by columns.
_SPLIT_ROWS = re.compile(r".*\.(self_attn\.(q_b_proj|kv_b_proj)|mlp\.(.+\.)?(gate_proj|up_proj))\.weight$")
_SPLIT_COLUMNS = re.compile(r".*\.(self_attn\.o_proj|mlp\.(.+\.)?down_proj)\.weight$")


def split_dim(name: str) -> int | None:
    """The dimension a checkpoint tensor is split along across tensor-parallel ranks; None: replicated."""
    return 0 if _SPLIT_ROWS.match(name) else 1 if _SPLIT_COLUMNS.match(name) else None


class SafetensorsCheckpoint:
    """Tensor names -> files of a (possibly sharded) safetensors checkpoint; reads lazily."""

    def __init__(self, model_dir: str | Path):
        self.dir = Path(model_dir)
        index = self.dir / "model.safetensors.index.json"
        if index.is_file():
            self.files = dict(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
        elif (self.dir / "model.safetensors").is_file():
            with safe_open(self.dir / "model.safetensors", "pt") as f:
                self.files = {name: "model.safetensors" for name in f.keys()}
        else:
            raise WeightError(f"no model.safetensors or model.safetensors.index.json in {model_dir}")
        self._open: dict[str, object] = {}

    def names(self) -> set[str]:
        return set(self.files)

    def get(self, name: str) -> torch.Tensor:
        return self._file(name).get_tensor(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._file(name).get_slice(name).get_shape())

    def get_part(self, name: str):
        """The tensor unread: indexing it reads only the part indexed."""
        return self._file(name).get_slice(name)

    def _file(self, name: str):
        file = self.files[name]
        if file not in self._open:
            path = self.dir / file
            if not path.is_file():
                raise WeightError(f"{name} is mapped to {file}, which does not exist")
            self._open[file] = safe_open(path, "pt")
        return self._open[file]


_EXPERT = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


# Weights an FP8 checkpoint keeps quantized that the model still dequantizes when it keeps the
# rest in e4m3: kv_b_proj is folded into the query and the output per head (mla.py), not applied
# as a linear layer.
_DEQUANTIZED_ALWAYS = (".kv_b_proj.weight",)


def load_weights(model_dir: str | Path, config: ModelConfig, dtype: torch.dtype, keep_fp8: bool = False,
                 tp: TensorParallel = TensorParallel(), device: torch.device | str = "cpu",
                 ) -> tuple[dict[str, torch.Tensor], CheckpointInfo]:
    """Read, validate and convert a checkpoint to the model's state-dict names and `dtype`; with
    keep_fp8 the FP8 block weights stay e4m3, each with its `<name>_scale_inv` (float32) beside it.
    With tp, rank tp.rank's share of the split tensors (for a model of config.sharded(tp.size)).
    Each tensor moves to `device` as it is read, and a layer's experts are stacked as soon as they
    are all read, so the host holds about one tensor at a time and `device` one layer's experts twice."""
    ckpt = SafetensorsCheckpoint(model_dir)
    names = ckpt.names()
    info = CheckpointInfo(mtp_has_indexer=_mtp_has_indexer(config, names))
    expected = checkpoint_tensor_shapes(config, info.mtp_has_indexer)
    quantized = {n[: -len("_scale_inv")] for n in names if n.endswith(".weight_scale_inv")}
    if quantized and config.quantization is None:
        raise WeightError(f"{sorted(quantized)[0]}_scale_inv found but config.json has no quantization_config")
    _check_names(config, expected, names - {n + "_scale_inv" for n in quantized})

    state: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor | None]]] = {}
    local = config.sharded(tp.size)
    for name, shape in expected.items():
        if ckpt.shape(name) != shape:
            raise WeightError(f"{name} has shape {ckpt.shape(name)}, expected {shape}")
        tensor, scale = _read_share(ckpt, name, name in quantized, config, keep_fp8, tp)
        if scale is None and tensor.dtype == torch.float8_e4m3fn:
            raise WeightError(f"{name} is float8 but has no {name}_scale_inv")
        # fp32 in releases, or (the router's) computed in fp32 there: a cast a call otherwise
        keep_fp32 = name.endswith(("e_score_correction_bias", "weights_proj.weight", "mlp.gate.weight"))
        tensor = tensor.to(device, tensor.dtype if scale is not None else torch.float32 if keep_fp32 else dtype)
        scale = None if scale is None else scale.to(device)
        match = _EXPERT.match(name)
        if match:
            prefix = _model_name(match.group(1), config)
            parts = experts.setdefault(prefix, {})
            parts[(int(match.group(2)), match.group(3))] = (tensor, scale)
            if len(parts) == 3 * config.n_routed_experts:   # the layer's last expert
                state.update(_stacked_experts(prefix, experts.pop(prefix), local, dtype))
        else:
            state[_model_name(name, config)] = tensor
            if scale is not None:
                state[_model_name(name, config) + "_scale_inv"] = scale
    for j in range(config.num_nextn_predict_layers):
        # Releases repeat the embedding and head in the MTP layer; the model shares the main ones.
        p = f"model.layers.{config.num_hidden_layers + j}."
        for name in (p + "embed_tokens.weight", p + "shared_head.head.weight"):
            if name in names and ckpt.shape(name) != (config.vocab_size, config.hidden_size):
                raise WeightError(f"{name} has shape {ckpt.shape(name)}, "
                                  f"expected {(config.vocab_size, config.hidden_size)}")
    block = config.quantization.block[0] if config.quantization else None
    for name in [n for n in state if n.endswith(".self_attn.q_a_proj.weight")]:
        prefix = name[: -len("q_a_proj.weight")]
        stacks = stacked_projections(local, has_indexer=prefix + "indexer.wk.weight" in state)
        for stacked, parts in stacks.items():
            _stack(state, prefix, stacked, [part for part, _ in parts], block, dtype)
    for name in [n for n in state if n.endswith(".gate_proj.weight")]:
        _stack(state, name[: -len("gate_proj.weight")], GATE_UP[0], GATE_UP[1], block, dtype)
    return state, info


def _read_share(ckpt: SafetensorsCheckpoint, name: str, quantized: bool, config: ModelConfig, keep_fp8: bool,
                tp: TensorParallel) -> tuple[torch.Tensor, torch.Tensor | None]:
    """This rank's share of a tensor, and its block scales where it stays in e4m3. A share that
    would cut an FP8 block (small test models) is taken from the dequantized whole."""
    dim = split_dim(name) if tp.size > 1 else None
    scale = None
    if quantized:
        block = config.quantization.block
        scale = _checked_scale(name, ckpt.shape(name), ckpt.get(name + "_scale_inv"), block)
        if not keep_fp8 or name.endswith(_DEQUANTIZED_ALWAYS) or (
                dim is not None and (ckpt.shape(name)[dim] // tp.size) % block[dim]):
            whole = dequantize_weight_ref(ckpt.get(name), scale)
            return (whole if dim is None else _part(whole, dim, tp.part(whole.shape[dim])).contiguous()), None
    if dim is None:
        return ckpt.get(name), scale
    part = tp.part(ckpt.shape(name)[dim])
    if scale is not None:
        blocks = slice(part.start // block[dim], part.stop // block[dim])
        scale = _part(scale, dim, blocks).contiguous()
    return _part(ckpt.get_part(name), dim, part), scale


def _part(tensor, dim: int, part: slice):
    """tensor[part] along dim 0 or 1 (a tensor, or a safetensors slice, which reads only that part)."""
    return tensor[part] if dim == 0 else tensor[:, part]


def _checked_scale(name: str, shape: tuple[int, ...], scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    expected = tuple(-(-n // b) for n, b in zip(shape, block))
    if tuple(scale_inv.shape) != expected:
        raise WeightError(f"{name}_scale_inv has shape {tuple(scale_inv.shape)}, expected {expected}")
    return scale_inv.float()


def _stack(state: dict[str, torch.Tensor], prefix: str, stacked: str, parts, block: int | None,
           dtype: torch.dtype) -> None:
    """Replace the linear layers `parts` under prefix in `state` by one, `stacked`, their weights
    (and scales) stacked by rows in that order."""
    weights = [(state.pop(prefix + part + ".weight"), state.pop(prefix + part + ".weight_scale_inv", None))
               for part in parts]
    state[prefix + stacked + ".weight"], scale = _stacked_rows(weights, block, dtype)
    if scale is not None:
        state[prefix + stacked + ".weight_scale_inv"] = scale


def _stacked_rows(parts: list[tuple[torch.Tensor, torch.Tensor | None]], block: int | None,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Weights of one input stacked by rows: in e4m3 with stacked scales where every part came so,
    else in dtype (the e4m3 parts dequantized)."""
    if any(scale is None for _, scale in parts):
        return torch.cat([w if s is None else dequantize_weight_ref(w, s).to(dtype) for w, s in parts]), None
    return torch.cat([w for w, _ in parts]), _stacked_scales([(w.shape[0], s) for w, s in parts], block)


def _stacked_scales(parts: list[tuple[int, torch.Tensor]], block: int) -> torch.Tensor:
    """The scales of weights stacked by rows, given each part's (rows, block scales): they keep
    the checkpoints' row blocks where every part but the last ends on one; otherwise each row
    gets its own copy of its block's scale (dsa_kernels' FP8 GEMMs take either)."""
    if all(rows % block == 0 for rows, _ in parts[:-1]):
        return torch.cat([scale for _, scale in parts])
    return torch.cat([scale.repeat_interleave(block, 0)[:rows] for rows, scale in parts])


def _stacked_experts(prefix: str, parts: dict, config: ModelConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One layer's per-expert tensors as w13 [E, 2I, H] (gate then up) and w2 [E, H, I], in e4m3
    with their scales (`_stacked_scales`) where every part came so, else in dtype."""
    n, block = config.n_routed_experts, config.quantization.block if config.quantization else None
    if any(scale is None for _, scale in parts.values()):
        parts = {key: (tensor if scale is None else dequantize_weight_ref(tensor, scale).to(dtype), None)
                 for key, (tensor, scale) in parts.items()}
    w13 = torch.stack([torch.cat([parts[(e, "gate")][0], parts[(e, "up")][0]]) for e in range(n)])
    state = {prefix + ".w13": w13, prefix + ".w2": torch.stack([parts[(e, "down")][0] for e in range(n)])}
    if parts[(0, "down")][1] is None:
        return state
    rows = config.moe_intermediate_size
    state[prefix + ".w13_scale_inv"] = torch.stack(
        [_stacked_scales([(rows, parts[(e, "gate")][1]), (rows, parts[(e, "up")][1])], block[0]) for e in range(n)])
    state[prefix + ".w2_scale_inv"] = torch.stack([parts[(e, "down")][1] for e in range(n)])
    return state


def _mtp_has_indexer(config: ModelConfig, names: set[str]) -> bool:
    layers = range(config.num_hidden_layers, config.num_hidden_layers + config.num_nextn_predict_layers)
    return any(f"model.layers.{i}.self_attn.indexer.wq_b.weight" in names for i in layers)


def _check_names(config: ModelConfig, expected: dict[str, tuple[int, ...]], names: set[str]) -> None:
    optional = set()
    for j in range(config.num_nextn_predict_layers):
        p = f"model.layers.{config.num_hidden_layers + j}."
        optional |= {p + "embed_tokens.weight", p + "shared_head.head.weight"}
    missing = sorted(set(expected) - names)
    if missing:
        raise WeightError(f"checkpoint is missing {missing[0]}" + _plan_hint(config, missing[0])
                          + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    unexpected = sorted(names - set(expected) - optional)
    if unexpected:
        raise WeightError(f"unexpected tensor {unexpected[0]}" + _plan_hint(config, unexpected[0])
                          + (f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""))


def _plan_hint(config: ModelConfig, name: str) -> str:
    match = re.match(r"model\.layers\.(\d+)\.self_attn\.indexer\.", name)
    if not match or int(match.group(1)) >= config.num_hidden_layers:
        return ""
    layer = int(match.group(1))
    kind = "full (runs its own indexer)" if config.indexer_plan[layer].full else "shared (reuses the previous top-k)"
    return f": layer {layer} is {kind} in the indexer plan from config.json"


def _model_name(name: str, config: ModelConfig) -> str:
    """Checkpoint name -> model state-dict name (the MTP layer moves to mtp.{j})."""
    match = re.match(r"model\.layers\.(\d+)\.(.*)", name)
    if match and int(match.group(1)) >= config.num_hidden_layers:
        j = int(match.group(1)) - config.num_hidden_layers
        rest = match.group(2)
        if rest.startswith(("self_attn.", "mlp.", "input_layernorm.", "post_attention_layernorm.")):
            rest = "decoder." + rest
        return f"mtp.{j}.{rest}"
    return name


def mtp_checkpoint_tensors(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """The MTP layers' tensors of a model state dict whose weights are not kept in FP8, under their
    checkpoint names (inverse of load)."""
    stacks = stacked_projections(config, has_indexer=False).keys()
    out = {}
    for name, tensor in state.items():
        match = re.match(r"mtp\.(\d+)\.(decoder\.)?(.*)", name)
        if not match:
            continue
        prefix = f"model.layers.{config.num_hidden_layers + int(match.group(1))}."
        rest = match.group(3)
        if rest.endswith("mlp.experts.w13"):
            base = prefix + rest[: -len("w13")]
            for e, w in enumerate(tensor):
                gate, up = w.chunk(2)
                out[f"{base}{e}.gate_proj.weight"], out[f"{base}{e}.up_proj.weight"] = gate, up
        elif rest.endswith("mlp.experts.w2"):
            base = prefix + rest[: -len("w2")]
            for e, w in enumerate(tensor):
                out[f"{base}{e}.down_proj.weight"] = w
        elif rest.endswith(GATE_UP[0] + ".weight"):
            base = prefix + rest[: -len(GATE_UP[0] + ".weight")]
            for part, w in zip(GATE_UP[1], tensor.chunk(2)):
                out[f"{base}{part}.weight"] = w
        elif (stacked := re.fullmatch(r"self_attn\.(\w+)\.weight", rest)) and stacked.group(1) in stacks:
            has_indexer = f"mtp.{match.group(1)}.decoder.self_attn.indexer.k_norm.weight" in state
            parts = stacked_projections(config, has_indexer)[stacked.group(1)]
            for (part, _), w in zip(parts, tensor.split([rows for _, rows in parts])):
                out[f"{prefix}self_attn.{part}.weight"] = w
        else:
            out[prefix + rest] = tensor
    return out
