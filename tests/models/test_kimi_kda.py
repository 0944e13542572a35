"""KDA: chunked prefill and recurrent decode against fla-core's naive references (fp32).

fla.ops.kda.naive imports and runs on CPU (fla-core 0.6.0 only warns that Triton falls back),
so the comparison is against fla's own `naive_recurrent_kda` / `naive_chunk_kda` and
`naive_kda_gate`, independent of our code.
"""
import warnings

import pytest
import torch

from engined.layers.kda import KDA, chunked_kda, kda_gate, recurrent_kda_step, short_conv

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fla.ops.kda.gate import naive_kda_gate
    from fla.ops.kda.naive import naive_chunk_kda, naive_recurrent_kda


def _inputs(t, h=3, k=16, v=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(t, h, k, generator=g), dim=-1)
    kk = torch.nn.functional.normalize(torch.randn(t, h, k, generator=g), dim=-1)
    vv = torch.randn(t, h, v, generator=g)
    gate = -torch.rand(t, h, k, generator=g) * 0.7   # log-decay <= 0
    beta = torch.rand(t, h, generator=g)
    s0 = torch.randn(h, k, v, generator=g) * 0.3
    return q, kk, vv, gate, beta, s0


def _fla(q, k, v, g, beta, s0, fn=naive_recurrent_kda, **kw):
    o, s = fn(q[None], k[None], v[None], g[None], beta[None], scale=q.shape[-1] ** -0.5,
              initial_state=s0[None].clone(), output_final_state=True, **kw)
    return o[0], s[0]


@pytest.mark.parametrize("t", [1, 2, 17, 64, 65, 130])
def test_chunked_prefill_matches_fla_recurrent(t):
    q, k, v, g, beta, s0 = _inputs(t)
    want_o, want_s = _fla(q, k, v, g, beta, s0)
    S = s0.clone()
    o = chunked_kda(q, k, v, g, beta, S, q.shape[-1] ** -0.5)
    torch.testing.assert_close(o, want_o, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(S, want_s, atol=2e-5, rtol=1e-4)


def test_chunked_prefill_matches_fla_chunk_form_with_small_chunks():
    q, k, v, g, beta, s0 = _inputs(48, seed=3)
    want_o, want_s = _fla(q, k, v, g, beta, s0, fn=naive_chunk_kda, chunk_size=16)
    S = s0.clone()
    o = chunked_kda(q, k, v, g, beta, S, q.shape[-1] ** -0.5, chunk=16)
    torch.testing.assert_close(o, want_o, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(S, want_s, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("t", [64, 90])
def test_strong_decay_stays_finite(t):
    """Γ differences are only exponentiated inside a chunk and masked before exp (no inf*0);
    90 tokens end in a padded sub-block."""
    q, k, v, g, beta, s0 = _inputs(t, seed=4)
    g = g * 60                                          # exp(Γ) underflows to 0 within the chunk
    S = s0.clone()
    o = chunked_kda(q, k, v, g, beta, S, 0.25)
    want_o, want_s = _fla(q, k, v, g, beta, s0)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    torch.testing.assert_close(o, want_o, atol=2e-5, rtol=1e-4)


def test_recurrent_decode_matches_fla_step_by_step():
    q, k, v, g, beta, s0 = _inputs(9, seed=1)
    want_o, want_s = _fla(q, k, v, g, beta, s0)
    S = s0.clone()
    outs = [recurrent_kda_step(q[i], k[i], v[i], g[i], beta[i], S, q.shape[-1] ** -0.5) for i in range(9)]
    torch.testing.assert_close(torch.stack(outs), want_o, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S, want_s, atol=1e-5, rtol=1e-5)


def test_gate_matches_fla_naive_gate():
    g = torch.Generator().manual_seed(2)
    r = torch.randn(5, 3, 16, generator=g) * 8           # covers softplus' x > 20 branch
    a_log, dt = torch.randn(1, 1, 3, 1, generator=g), torch.randn(48, generator=g)
    torch.testing.assert_close(kda_gate(r, a_log, dt), naive_kda_gate(r, a_log.view(3), dt))


def test_short_conv_carries_its_window_across_calls():
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(11, 6, generator=g), torch.randn(6, 1, 4, generator=g)
    # explicit definition: y_t[d] = silu(sum_i w[d, i] * x_{t-3+i}[d]), zeros before the start
    padded = torch.cat((torch.zeros(3, 6), x))
    want = torch.stack([torch.nn.functional.silu((padded[t:t + 4].t() * w[:, 0]).sum(-1)) for t in range(11)])
    window = torch.zeros(6, 3)
    got = torch.cat([short_conv(x[:5], w, window)] + [short_conv(x[i:i + 1], w, window) for i in range(5, 11)])
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def _layer(seed=0):
    g = torch.Generator().manual_seed(seed)
    layer = KDA(hidden=32, num_heads=2, head_dim=16, conv_size=4, eps=1e-5, dtype=torch.float32)
    for t in (layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight, layer.f_a_proj.weight,
              layer.f_b_proj.weight, layer.g_a_proj.weight, layer.g_b_proj.weight, layer.b_proj.weight,
              layer.o_proj.weight, layer.q_conv1d, layer.k_conv1d, layer.v_conv1d, layer.dt_bias):
        t.copy_(torch.randn(t.shape, generator=g) * t.shape[-1] ** -0.5)
    layer.A_log.copy_(torch.rand(layer.A_log.shape, generator=g))
    layer.o_norm.weight.copy_(1 + 0.1 * torch.randn(16, generator=g))
    return layer


def test_layer_prefill_then_decode_equals_full_prefill():
    layer = _layer()
    a = torch.randn(70, 32, generator=torch.Generator().manual_seed(9))
    full_state = layer.new_state(torch.float32, "cpu")
    full = layer(a, full_state)
    state = layer.new_state(torch.float32, "cpu")
    parts = [layer(a[:40], state)] + [layer(a[i:i + 1], state) for i in range(40, 70)]
    torch.testing.assert_close(torch.cat(parts), full, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(state.S, full_state.S, atol=1e-5, rtol=1e-4)


def test_layer_matches_reference_equations_with_fla_recurrence():
    """Whole layer (§2.2 steps 1-8) built from plain torch + fla's naive recurrence and gate."""
    layer, a = _layer(seed=1), torch.randn(13, 32, generator=torch.Generator().manual_seed(4))
    F = torch.nn.functional

    def conv(x, w):  # causal depthwise conv of width 4 + SiLU, zeros before the start
        return F.silu(F.conv1d(F.pad(x.t()[None], (3, 0)), w, groups=w.shape[0])[0].t())

    q = F.normalize(conv(a @ layer.q_proj.weight.t(), layer.q_conv1d).view(13, 2, 16), dim=-1, eps=0)
    k = F.normalize(conv(a @ layer.k_proj.weight.t(), layer.k_conv1d).view(13, 2, 16), dim=-1, eps=0)
    v = conv(a @ layer.v_proj.weight.t(), layer.v_conv1d).view(13, 2, 16)
    r = (a @ layer.f_a_proj.weight.t() @ layer.f_b_proj.weight.t()).view(13, 2, 16)
    g = naive_kda_gate(r, layer.A_log.view(2), layer.dt_bias)
    beta = torch.sigmoid(a @ layer.b_proj.weight.t())
    o, _ = _fla(q, k, v, g, beta, torch.zeros(2, 16, 16))
    z = (a @ layer.g_a_proj.weight.t() @ layer.g_b_proj.weight.t()).view(13, 2, 16)
    y = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * layer.o_norm.weight * torch.sigmoid(z)
    want = y.reshape(13, 32) @ layer.o_proj.weight.t()
    got = layer(a, layer.new_state(torch.float32, "cpu"))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
