"""An independent Kimi-Linear forward over the raw checkpoint dict (HF names), fp32, written
from the reference's §2 equations with per-token / per-head / per-expert loops and fla-core's
naive KDA recurrence. Slow by design; only for tiny checkpoints."""
import math
import warnings

import torch
import torch.nn.functional as F

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fla.ops.kda.gate import naive_kda_gate
    from fla.ops.kda.naive import naive_recurrent_kda


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def kda(W, p, a, cfg):
    lin = cfg["linear_attn_config"]
    h, k = lin["num_heads"], lin["head_dim"]
    T = a.shape[0]

    def conv(x, w):
        return F.silu(F.conv1d(F.pad(x.t()[None], (w.shape[-1] - 1, 0)), w, groups=w.shape[0])[0].t())
    q = conv(a @ W[p + "q_proj.weight"].t(), W[p + "q_conv1d.weight"]).view(T, h, k)
    kk = conv(a @ W[p + "k_proj.weight"].t(), W[p + "k_conv1d.weight"]).view(T, h, k)
    v = conv(a @ W[p + "v_proj.weight"].t(), W[p + "v_conv1d.weight"]).view(T, h, k)
    q, kk = (x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6) for x in (q, kk))
    g = naive_kda_gate((a @ W[p + "f_a_proj.weight"].t() @ W[p + "f_b_proj.weight"].t()).view(T, h, k),
                       W[p + "A_log"].view(h), W[p + "dt_bias"])
    beta = torch.sigmoid(a @ W[p + "b_proj.weight"].t())
    o, _ = naive_recurrent_kda(q[None], kk[None], v[None], g[None], beta[None], scale=k ** -0.5)
    z = (a @ W[p + "g_a_proj.weight"].t() @ W[p + "g_b_proj.weight"].t()).view(T, h, k)
    y = rms(o[0], W[p + "o_norm.weight"], cfg["rms_norm_eps"]) * torch.sigmoid(z)
    return y.reshape(T, -1) @ W[p + "o_proj.weight"].t()


def mla(W, p, a, cfg):
    H, N, P, V, R = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
                     cfg["v_head_dim"], cfg["kv_lora_rank"])
    keys, vals, out = [], [], []
    for t in range(a.shape[0]):
        ckr = W[p + "kv_a_proj_with_mqa.weight"] @ a[t]
        kv = (W[p + "kv_b_proj.weight"] @ rms(ckr[:R], W[p + "kv_a_layernorm.weight"], 1e-6)).view(H, N + V)
        keys.append([torch.cat((kv[h, :N], ckr[R:])) for h in range(H)])
        vals.append([kv[h, N:] for h in range(H)])
        q = (W[p + "q_proj.weight"] @ a[t]).view(H, N + P)
        heads = []
        for h in range(H):
            pr = torch.softmax(torch.stack([q[h] @ keys[s][h] for s in range(t + 1)]) / math.sqrt(N + P), 0)
            heads.append(sum(pr[s] * vals[s][h] for s in range(t + 1)))
        out.append(W[p + "o_proj.weight"] @ torch.cat(heads))
    return torch.stack(out)


def swiglu(W, p, x):
    return W[p + "down_proj.weight"] @ (F.silu(W[p + "gate_proj.weight"] @ x) * (W[p + "up_proj.weight"] @ x))


def moe(W, p, f, cfg):
    rows = []
    for x in f:
        s = torch.sigmoid(W[p + "gate.weight"] @ x)
        c = s + W[p + "gate.e_score_correction_bias"]
        chosen = sorted(range(len(s)), key=lambda e: -c[e].item())[:cfg["num_experts_per_token"]]
        total = sum(s[e] for e in chosen)
        y = sum(cfg["routed_scaling_factor"] * s[e] / (total + 1e-20) * (W[p + f"experts.{e}.w2.weight"] @ (
            F.silu(W[p + f"experts.{e}.w1.weight"] @ x) * (W[p + f"experts.{e}.w3.weight"] @ x))) for e in chosen)
        rows.append(y + swiglu(W, p + "shared_experts.", x))
    return torch.stack(rows)


def forward(W: dict, cfg: dict, tokens: torch.Tensor) -> torch.Tensor:
    """tokens [T] -> logits [T, V] fp32."""
    W = {k: v.float() for k, v in W.items()}
    eps, h = cfg["rms_norm_eps"], W["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms(h, W[p + "input_layernorm.weight"], eps)
        is_kda = i + 1 in cfg["linear_attn_config"]["kda_layers"]
        h = h + (kda if is_kda else mla)(W, p + "self_attn.", a, cfg)
        f = rms(h, W[p + "post_attention_layernorm.weight"], eps)
        if i < cfg["first_k_dense_replace"]:
            h = h + torch.stack([swiglu(W, p + "mlp.", x) for x in f])
        else:
            h = h + moe(W, p + "block_sparse_moe.", f, cfg)
    return rms(h, W["model.norm.weight"], eps) @ W["lm_head.weight"].t()
