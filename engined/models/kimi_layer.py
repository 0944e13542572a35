"""One Kimi-Linear decoder layer (models/kimi_linear.py wires them): norm, KDA or MLA, norm,
dense MLP or MoE, for a prefill chunk (__call__) and for a decode step's rows (decode_batch)."""
import torch

from engined.layers.kda import KDA
from engined.layers.mla import MLA
from engined.layers.mlp import SwiGLU
from engined.layers.moe import MoE, scope
from engined.layers.moe_offload import HostExperts
from engined.layers.rmsnorm import RMSNorm
from engined.models.kimi_cache import DecodeRows, KimiCache, StatePool
from engined.models.kimi_linear_config import KimiLinearConfig
from engined.models.latent_pool import LatentPool
from engined.ops import registry


class DecoderLayer:
    """Attribute names follow the checkpoint (self_attn, mlp | block_sparse_moe); `moe` says
    which, for code that is not loading weights by name (None: a dense layer)."""

    def __init__(self, cfg: KimiLinearConfig, i: int, dtype, device, int4: dict[str, int],
                 host_experts: HostExperts | None = None):
        eps, d = cfg.rms_norm_eps, cfg.hidden_size
        self.input_layernorm = RMSNorm(d, eps, dtype, device)
        self.post_attention_layernorm = RMSNorm(d, eps, dtype, device)
        self.is_mla = i in cfg.mla_layers
        attn = scope(int4, "self_attn")
        self.self_attn = (
            MLA(d, cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_nope_head_dim,
                cfg.qk_rope_head_dim, cfg.v_head_dim, dtype, device, attn) if self.is_mla else
            KDA(d, cfg.kda_num_heads, cfg.kda_head_dim, cfg.conv_kernel_size, eps, dtype, device, attn))
        self.moe: MoE | None = None  # the routed FFN where this layer has one (else a dense mlp)
        if cfg.is_moe(i):
            self.block_sparse_moe = self.ffn = self.moe = MoE(
                d, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_experts_per_token,
                cfg.num_shared_experts, cfg.moe_renormalize, cfg.routed_scaling_factor,
                dtype, device, scope(int4, "block_sparse_moe"), host_experts)
        else:
            self.mlp = self.ffn = SwiGLU.empty(d, cfg.intermediate_size, dtype, device, scope(int4, "mlp"))

    def __call__(self, h: torch.Tensor, cache: KimiCache, i: int, start: int) -> torch.Tensor:
        """h: [T, D] at positions start..start+T-1, the residual stream, updated in place (the
        attention's output added by the norm that reads it, add_rmsnorm, as in decode) -> h."""
        norm = registry.resolve("add_rmsnorm", h.device.type).fn
        a = norm(h, None, self.input_layernorm.weight, self.input_layernorm.eps)
        if self.is_mla:
            rows = cache.rows(0, start + h.shape[0])                # [S] its latent rows
            attn = self.self_attn(a, cache.latent_pool.flat(i), start, rows)
        else:
            attn = self.self_attn(a, cache.state(i))    # one layer's views, not every layer's
        f = norm(h, attn, self.post_attention_layernorm.weight, self.post_attention_layernorm.eps)
        return h.add_(self.ffn(f))

    def decode_batch(self, h: torch.Tensor, delta: torch.Tensor | None, i: int,
                     pools: tuple[StatePool, LatentPool], rows: DecodeRows) -> torch.Tensor:
        """h: [B, D] the residual stream, updated in place: the layer before's output delta
        (None before layer 0) is added by the norm that reads it (add_rmsnorm) -> this layer's
        FFN output, for the next norm to add. Row b is one token at rows.positions[b] of the
        sequence on slot rows.slots[b]."""
        return self.ffn(self.decode_attention(h, delta, i, pools, rows))  # MoE: one moe_decode

    def decode_attention(self, h: torch.Tensor, delta: torch.Tensor | None, i: int,
                         pools: tuple[StatePool, LatentPool], rows: DecodeRows) -> torch.Tensor:
        """decode_batch up to the FFN: h updated in place as there -> the FFN's input [B, D]."""
        norm = registry.resolve("add_rmsnorm", h.device.type).fn
        a = norm(h, delta, self.input_layernorm.weight, self.input_layernorm.eps)
        states, latents = pools
        if self.is_mla:
            attn = self.self_attn.decode_batch(a, latents.latents[i], rows.block_tables,
                                               rows.positions, rows.lengths)
        else:
            attn = self.self_attn.decode_batch(a, states.conv[i], states.S[i], rows.slots,
                                               rows.passes)
        return norm(h, attn, self.post_attention_layernorm.weight, self.post_attention_layernorm.eps)
