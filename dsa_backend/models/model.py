"""DeepSeek-V3.2 / GLM-5 causal LM over paged KV pools, with its MTP (nextn) layers."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dsa_backend.attention import default_backend
from dsa_backend.batch import ForwardBatch
from dsa_backend.cache import KVCache
from dsa_backend.config import ModelConfig
from dsa_backend.models.layers import DenseMlp, RMSNorm, RotaryEmbedding
from dsa_backend.models.mla import MlaAttention
from dsa_backend.models.moe import MoE
from dsa_backend.parallel import TensorParallel


class DecoderLayer(nn.Module):
    """Attention then MLP, each added to the residual; under tensor parallelism each is a rank's
    partial sum (its heads, its hidden units), summed across the ranks first."""

    def __init__(self, c: ModelConfig, layer_id: int, moe: bool, has_indexer: bool, is_nextn: bool = False,
                 tp: TensorParallel = TensorParallel()):
        super().__init__()
        self.tp = tp
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = MlaAttention(c, layer_id, has_indexer, is_nextn)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MoE(c) if moe else DenseMlp(c.hidden_size, c.intermediate_size)

    def forward(self, x, cos, sin, batch, cache, backend, prev_topk):
        attn, topk = self.self_attn(self.input_layernorm(x), cos, sin, batch, cache, backend, prev_topk)
        x = x + self.tp.all_reduce(attn)
        return x + self.tp.all_reduce(self.mlp(self.post_attention_layernorm(x))), topk


class DsaModel(nn.Module):
    def __init__(self, c: ModelConfig, tp: TensorParallel):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(c, i, c.is_moe_layer(i), c.indexer_plan[i].full, tp=tp) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class SharedHead(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class MtpLayer(nn.Module):
    """DeepSeek's multi-token-prediction layer: predicts the token after next from the target's
    hidden state and the next token's embedding. Embedding and head are the main model's."""

    def __init__(self, c: ModelConfig, layer_id: int, has_indexer: bool, tp: TensorParallel):
        super().__init__()
        self.enorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hnorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=False)
        self.decoder = DecoderLayer(c, layer_id, moe=True, has_indexer=has_indexer, is_nextn=True, tp=tp)
        self.shared_head = SharedHead(c)


@dataclass(frozen=True)
class ForwardOutput:
    """logits [rows, vocab] float32 for batch.logits_rows; hidden [tokens, hidden] after the final
    norm (what the MTP layer takes); topk [tokens, index_topk] of the last layer (MTP may reuse it)."""

    logits: torch.Tensor
    hidden: torch.Tensor
    topk: torch.Tensor


class DsaForCausalLM(nn.Module):
    """c: this rank's sizes (ModelConfig.sharded) under tensor parallelism tp."""

    def __init__(self, c: ModelConfig, mtp_has_indexer: bool = True, backend=None,
                 tp: TensorParallel = TensorParallel()):
        super().__init__()
        self.config = c
        self.model = DsaModel(c, tp)
        self.lm_head = None if c.tie_word_embeddings else nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.mtp = nn.ModuleList(MtpLayer(c, c.num_hidden_layers + j, mtp_has_indexer, tp)
                                 for j in range(c.num_nextn_predict_layers))
        self.rotary = RotaryEmbedding(c.rope)
        self.backend = backend  # None: chosen by device (kernels on CUDA, the reference on CPU)

    def _backend(self, batch: ForwardBatch):
        return self.backend or default_backend(batch.input_ids.device)

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return torch.nn.functional.linear(hidden, weight).float()

    def head_logprobs(self, hidden: torch.Tensor, token_ids: torch.Tensor, rows_a_piece: int = 256) -> torch.Tensor:
        """[rows] float32: log p(token_ids[i]) under the raw logits of hidden[i], a piece of rows at
        a time (a prompt chunk's logits over the whole vocabulary would take GBs)."""
        parts = []
        for i in range(0, len(token_ids), rows_a_piece):
            logits = self._head(hidden[i: i + rows_a_piece])
            picked = logits.gather(1, token_ids[i: i + rows_a_piece, None]).squeeze(1)
            parts.append(picked - logits.logsumexp(dim=-1))
        return torch.cat(parts)

    def forward(self, batch: ForwardBatch, cache: KVCache) -> ForwardOutput:
        cos, sin = self.rotary(batch.positions)
        x = self.model.embed_tokens(batch.input_ids)
        topk = None
        backend = self._backend(batch)
        for layer in self.model.layers:
            x, topk = layer(x, cos, sin, batch, cache, backend, topk)
        hidden = self.model.norm(x)
        return ForwardOutput(self._head(hidden[batch.logits_rows]), hidden, topk)

    def forward_mtp(self, batch: ForwardBatch, cache: KVCache, target_hidden: torch.Tensor,
                    target_topk: torch.Tensor | None = None, depth: int = 0) -> ForwardOutput:
        """One MTP layer over batch.input_ids (the tokens after those target_hidden [T, hidden] saw).

        target_topk, when given, is reused instead of the layer's own indexer.
        """
        mtp = self.mtp[depth]
        cos, sin = self.rotary(batch.positions)
        embedded = self.model.embed_tokens(batch.input_ids)
        x = mtp.eh_proj(torch.cat([mtp.enorm(embedded), mtp.hnorm(target_hidden)], dim=-1))
        x, topk = mtp.decoder(x, cos, sin, batch, cache, self._backend(batch), target_topk)
        hidden = mtp.shared_head.norm(x)
        return ForwardOutput(self._head(hidden[batch.logits_rows]), hidden, topk)
