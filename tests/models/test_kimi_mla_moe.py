"""MLA and MoE against plain loops written from the reference equations (§2.4, §2.6), fp32."""
import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from engined.layers import mla as mla_module
from engined.layers.mla import MLA
from engined.layers.moe import MoE, route

H, R, N, P, V, D = 3, 16, 8, 4, 8, 32


def _rand(t, g, scale=None):
    t.copy_(torch.randn(t.shape, generator=g) * (scale if scale is not None else t.shape[-1] ** -0.5))


def _mla(seed=0):
    g = torch.Generator().manual_seed(seed)
    m = MLA(D, H, R, N, P, V, torch.float32)
    for p in (m.q_proj, m.kv_a_proj_with_mqa, m.kv_b_proj, m.o_proj):
        _rand(p.weight, g)
    m.kv_a_layernorm.weight.copy_(1 + 0.2 * torch.randn(R, generator=g))
    return m


def mla_loop(m: MLA, a: torch.Tensor) -> torch.Tensor:
    """Per token, per head, per key position, exactly as written in §2.4 (NoPE, eps 1e-6)."""
    T = a.shape[0]
    Wq, Wkva, Wkvb, Wo = (p.weight for p in (m.q_proj, m.kv_a_proj_with_mqa, m.kv_b_proj, m.o_proj))
    K, Vv = [], []
    for t in range(T):
        ckr = Wkva @ a[t]
        c, kr = ckr[:R], ckr[R:]
        c_hat = c / torch.sqrt((c * c).mean() + 1e-6) * m.kv_a_layernorm.weight
        kv = (Wkvb @ c_hat).view(H, N + V)
        K.append([torch.cat((kv[h, :N], kr)) for h in range(H)])
        Vv.append([kv[h, N:] for h in range(H)])
    out = []
    for t in range(T):
        q = (Wq @ a[t]).view(H, N + P)
        heads = []
        for h in range(H):
            s = torch.stack([q[h] @ K[j][h] / math.sqrt(N + P) for j in range(t + 1)])
            p = torch.softmax(s, 0)
            heads.append(sum(p[j] * Vv[j][h] for j in range(t + 1)))
        out.append(Wo @ torch.cat(heads))
    return torch.stack(out)


@pytest.mark.parametrize("absorb_max_t", [0, 128])   # expanded and absorbed prefill
def test_mla_prefill_matches_per_head_loop(monkeypatch, absorb_max_t):
    monkeypatch.setattr(mla_module, "ABSORB_MAX_T", absorb_max_t)
    m, a = _mla(), torch.randn(7, D, generator=torch.Generator().manual_seed(1))
    got = m(a, torch.zeros(16, R + P), 0)
    torch.testing.assert_close(got, mla_loop(m, a), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("absorb_max_t", [1, 128])
def test_mla_absorbed_decode_matches_loop_and_cache_holds_only_latents(monkeypatch, absorb_max_t):
    monkeypatch.setattr(mla_module, "ABSORB_MAX_T", absorb_max_t)
    m, a = _mla(2), torch.randn(9, D, generator=torch.Generator().manual_seed(3))
    cache = torch.full((12, R + P), float("nan"))   # poisoned: rows past the prefix must never be read
    parts = [m(a[:4], cache, 0)] + [m(a[i:i + 1], cache, i) for i in range(4, 9)]
    torch.testing.assert_close(torch.cat(parts), mla_loop(m, a), atol=1e-5, rtol=1e-4)
    assert cache.shape[-1] == R + P and torch.isnan(cache[9:]).all() and not torch.isnan(cache[:9]).any()


def _moe(seed=0, num_shared=1, experts=6, top_k=2):
    g = torch.Generator().manual_seed(seed)
    moe = MoE(D, 16, experts, top_k, num_shared, True, 2.446, torch.float32)
    for t in (moe.gate, moe.w1.weight, moe.w3.weight, moe.w2.weight):
        _rand(t, g)
    _rand(moe.e_score_correction_bias, g, 0.5)
    if moe.shared_experts is not None:
        for p in (moe.shared_experts.gate_proj, moe.shared_experts.up_proj, moe.shared_experts.down_proj):
            _rand(p.weight, g)
    return moe


def moe_loop(moe: MoE, f: torch.Tensor) -> torch.Tensor:
    """Per token, per expert, §2.6 with UNBIASED mixing weights."""
    silu = torch.nn.functional.silu
    rows = []
    for x in f:
        s = torch.sigmoid(moe.gate @ x)
        chosen = sorted(range(len(s)), key=lambda e: -(s[e] + moe.e_score_correction_bias[e]).item())[:moe.top_k]
        total = sum(s[e] for e in chosen)
        y = torch.zeros(D)
        for e in chosen:
            h = silu(moe.w1.weight[e] @ x) * (moe.w3.weight[e] @ x)
            y = y + 2.446 * s[e] / (total + 1e-20) * (moe.w2.weight[e] @ h)
        sh = moe.shared_experts
        y = y + sh.down_proj.weight @ (silu(sh.gate_proj.weight @ x) * (sh.up_proj.weight @ x))
        rows.append(y)
    return torch.stack(rows)


@pytest.mark.parametrize("t", [1, 5, 19])
def test_moe_matches_per_expert_loop(t):
    moe, f = _moe(), torch.randn(t, D, generator=torch.Generator().manual_seed(t))
    torch.testing.assert_close(moe(f), moe_loop(moe, f), atol=1e-5, rtol=1e-4)


def test_router_bias_selects_but_never_mixes():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0])         # forces expert 3 in, expert 1 out
    experts, weights = route(logits, bias, 2, True, 2.0)
    s = torch.sigmoid(logits[0]).tolist()
    assert sorted(experts[0].tolist()) == [0, 3]
    got = dict(zip(experts[0].tolist(), weights[0].tolist()))
    assert got[0] == pytest.approx(2.0 * s[0] / (s[0] + s[3]), rel=1e-6)
    assert got[3] == pytest.approx(2.0 * s[3] / (s[0] + s[3]), rel=1e-6)
    assert sum(got.values()) == pytest.approx(2.0, rel=1e-6)


def test_router_bias_keeps_its_fp32_values_under_bf16_activations():
    """On a GPU the activations are bf16; a checkpoint's fp32 bias 1 + 2**-10 must still beat
    1.0, as in fp32 routing (in bf16 both are 1.0: a tie, which topk gives expert 1)."""
    moe = MoE(D, 16, 4, 1, 0, True, 1.0, torch.bfloat16)
    moe.gate.zero_()                                   # every expert scores sigmoid(0)
    moe.e_score_correction_bias.copy_(torch.tensor([1.0 + 2 ** -10, 1.0, 0.0, 0.0]))
    experts, _ = moe.route_rows(torch.randn(1, D).to(torch.bfloat16))
    assert experts.tolist() == [[0]]


@pytest.mark.parametrize("t", [1, 4])
def test_int4_moe_matches_loop_on_dequantized_experts(t):
    """INT4 banks: decode runs the registered grouped kernels, prefill dequantizes per expert."""
    from engined.ops import int4_format
    dense = _moe(seed=7, experts=5, top_k=3)
    sym = int4_format.Int4Layout(16, symmetric=True)  # as the quantizer writes them: no mins
    packed = MoE(D, 16, 5, 3, 1, True, 2.446, torch.float32,
                 int4={"w1": sym, "w2": sym, "w3": sym, "shared_experts.gate_proj": sym})
    packed.gate.copy_(dense.gate)
    packed.e_score_correction_bias.copy_(dense.e_score_correction_bias)
    for name in ("w1", "w2", "w3"):
        src, dst = getattr(dense, name), getattr(packed, name)
        for e in range(5):
            p = int4_format.quantize_sym(src.weight[e], 16)
            for part in p.layout.parts:
                dst.slot(part, e).copy_(getattr(p, part))
            src.weight[e].copy_(int4_format.dequantize(p))
    p = int4_format.quantize_sym(dense.shared_experts.gate_proj.weight, 16)
    for part in p.layout.parts:
        packed.shared_experts.gate_proj.slot(part).copy_(getattr(p, part))
    dense.shared_experts.gate_proj.weight.copy_(int4_format.dequantize(p))
    for name in ("up_proj", "down_proj"):
        getattr(packed.shared_experts, name).weight.copy_(getattr(dense.shared_experts, name).weight)
    f = torch.randn(t, D, generator=torch.Generator().manual_seed(11))
    torch.testing.assert_close(packed(f), moe_loop(dense, f), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("absorb_max_t", [0, 128])   # expanded and absorbed prefill
def test_mla_prefill_after_a_prefix_matches_loop_with_no_float_score_matrix(monkeypatch, absorb_max_t):
    """Two prefill chunks (a prefix cache's resume): the second attends over the first's
    latents. Neither builds a floating [H, T, S] score matrix: SDPA holds the scores (the
    CPU's SDPA turns the second chunk's [T, S] bool mask into one float mask for all heads)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class LargestFloat(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(o, torch.Tensor) and o.is_floating_point():
                    LargestFloat.numel = max(LargestFloat.numel, o.numel())
            return out

    monkeypatch.setattr(mla_module, "ABSORB_MAX_T", absorb_max_t)
    m, a = _mla(4), torch.randn(150, D, generator=torch.Generator().manual_seed(5))
    cache = torch.zeros(160, R + P)
    with LargestFloat():
        got = torch.cat([m(a[:90], cache, 0), m(a[90:], cache, 90)])
    torch.testing.assert_close(got, mla_loop(m, a), atol=1e-5, rtol=1e-4)
    assert LargestFloat.numel <= 60 * 150               # [T, S] once, never [H, T, S]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("e,ev,shared", [(192, 192, False), (576, 576, False), (576, 576, True)])
def test_cuda_attention_after_a_prefix_is_lower_right_causal(e, ev, shared):
    """CUDA's causal_lower_right (no mask tensor) attends as the CPU's [T, S] bool mask: widths
    of the expanded path (flash) and of the absorbed one, which passes one latent row per key,
    a stride-0 view over the heads, as both K and V (MLA._absorbed, as served). Only flash and
    the memory-efficient kernel may run it: were the served views to fall back to the math
    kernel, a short chunk at 128k of context would make a [H, T, S] score matrix (1-2 GB), and
    this test would still pass; so such a fallback fails it, with torch's reasons."""
    g = torch.Generator().manual_seed(6)
    q, k, v = torch.randn(32, 300, e, generator=g), torch.randn(32, 1000, e, generator=g), \
        torch.randn(32, 1000, ev, generator=g)
    if shared:  # one latent row per key for every head, K and V the same view
        row = torch.randn(1, 1000, e, generator=g)
        k = v = row.expand(32, -1, -1)
    want = mla_module.attend(q, k, v, 700, e ** -0.5)
    k_gpu = row.cuda().bfloat16().expand(32, -1, -1) if shared else k.cuda().bfloat16()
    v_gpu = k_gpu if shared else v.cuda().bfloat16()
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        got = mla_module.attend(q.cuda().bfloat16(), k_gpu, v_gpu, 700, e ** -0.5)
    assert (got.float().cpu() - want).norm() / want.norm() < 2e-2
