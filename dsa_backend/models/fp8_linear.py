"""Linear layers whose weights stay in an FP8 checkpoint's e4m3 blocks (kernels/fp8_gemm.py)."""

from __future__ import annotations

import torch
from torch import nn

import dsa_kernels

FP8 = torch.float8_e4m3fn
SCALE_SUFFIX = "_scale_inv"  # the checkpoints' name for a weight's block scales


class Fp8Linear(nn.Module):
    """y = x @ W.T with W [out, in] in e4m3 and one float32 scale a 128 x 128 block (or a 1 x 128
    block: `scale_rows` = out, for stacked layers whose parts do not end on a block); x is
    quantized a 1 x 128 group at a time on the way in, y comes out in x's dtype."""

    def __init__(self, in_features: int, out_features: int, scale_rows: int | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=FP8), requires_grad=False)
        self.weight_scale_inv = nn.Parameter(
            torch.empty(scale_rows or -(-out_features // 128), -(-in_features // 128)), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = dsa_kernels.fp8_linear(x.reshape(-1, self.in_features), self.weight, self.weight_scale_inv)
        return y.view(*x.shape[:-1], self.out_features)

    def on_quantized(self, values: torch.Tensor, scales: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        """The layer on an input already quantized (dsa_kernels.quantize_act's layout), [M, in] -> [M, out]."""
        return dsa_kernels.fp8_linear_quantized(values, scales, self.weight, self.weight_scale_inv, out_dtype)


def expect_fp8_weights(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Make room in a model built on the meta device for the e4m3 weights in `state`, so that
    load_state_dict(state, assign=True) takes the checkpoint's bytes as they are: each nn.Linear
    whose weight comes with scales becomes an Fp8Linear, and a module holding stacked weights (the
    routed experts' w13 / w2) gets a `<name>_scale_inv` parameter beside each."""
    for name in [n for n in state if n.endswith(SCALE_SUFFIX)]:
        owner_name, _, scale = name.rpartition(".")
        weight = scale[: -len(SCALE_SUFFIX)]
        owner = model.get_submodule(owner_name)
        if isinstance(owner, nn.Linear) and weight == "weight" and owner.bias is None:
            parent_name, _, child = owner_name.rpartition(".")
            with torch.device("meta"):
                fp8 = Fp8Linear(owner.in_features, owner.out_features, scale_rows=state[name].shape[0])
                setattr(model.get_submodule(parent_name), child, fp8)
        elif scale in owner._parameters:  # declared (as None) by the module, e.g. Experts
            placeholder = torch.empty(state[name].shape, device="meta")
            owner.register_parameter(scale, nn.Parameter(placeholder, requires_grad=False))
        else:
            raise TypeError(f"{name}: {owner_name} is neither a bias-free nn.Linear nor declares {scale}")
