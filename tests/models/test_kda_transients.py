"""KDA prefill's transient memory (issue 29 item 6): the pair decays exp(Γ_i - Γ_j) are built
only inside SUB x SUB blocks, in head blocks sized from the device, never for a whole chunk."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engined.layers import kda


class LargestOutput(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.bytes = max(self.bytes, t.numel() * t.element_size())
        return out


def test_a_48b_chunk_never_builds_whole_chunk_pair_decays():
    h, c, k = 32, kda.CHUNK, 128                       # the 48B's heads and head width
    g = torch.Generator().manual_seed(0)
    q, kk, v = (torch.randn(c, h, k, generator=g) for _ in range(3))
    gate, beta = -torch.rand(c, h, k, generator=g), torch.rand(c, h, generator=g)
    with LargestOutput() as seen:
        kda.chunked_kda(q, kk, v, gate, beta, torch.zeros(h, k, k), k ** -0.5)
    whole_chunk = h * c * c * k * 4                    # [H, C, C, K] fp32: 67 MB
    assert seen.bytes <= h * c * kda.SUB * k * 4 < whole_chunk


def test_cuda_block_is_a_share_of_free_memory(monkeypatch):
    kda.decay_block_bytes.cache_clear()
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (80 << 30, 141 << 30))
    try:
        assert kda.decay_block_bytes("cuda") == 256 << 20
        kda.decay_block_bytes.cache_clear()
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (64 << 20, 141 << 30))
        assert kda.decay_block_bytes("cuda") == 4 << 20
    finally:
        kda.decay_block_bytes.cache_clear()


def test_cpu_block_is_the_last_level_cache():
    sizes = []
    for level in ("index0", "index1", "index2", "index3"):
        try:
            with open(f"/sys/devices/system/cpu/cpu0/cache/{level}/size") as f:
                text = f.read().strip()
        except OSError:
            continue
        sizes.append(int(text[:-1]) << {"K": 10, "M": 20}[text[-1]])
    assert kda.decay_block_bytes("cpu") == max(sizes + [kda.DECAY_BLOCK_BYTES])
