"""Equivalence cases of the per-layer ops with a cache or state: KDA's step on a slot pool,
paged MLA decode, the Llama decoder layer (tests/ops/helpers.py's CASES)."""
import torch

from engined.ops import int4_format
from engined.ops.int4_format import PackedInt4
from tests.ops.helpers import CASES, Case, kind_tag, random_int4


def kda_case(b: int, h: int, k: int, v: int, num_slots: int, seed=0) -> Case:
    """kda_step: B rows on distinct slots of an N-slot pool (unused slots must stay as they are)."""
    def make(gen):
        q, kk = (torch.nn.functional.normalize(torch.randn((b, h, k), generator=gen), dim=-1)
                 for _ in range(2))
        g = -torch.rand((b, h, k), generator=gen) * 0.5
        vv = torch.randn((b, h, v), generator=gen)
        beta = torch.rand((b, h), generator=gen)
        states = torch.randn((num_slots, h, k, v), generator=gen) * 0.1
        slots = torch.randperm(num_slots, generator=gen)[:b]
        return q, kk, vv, g, beta, states, slots, k ** -0.5
    return Case(f"B{b}-H{h}-K{k}-V{v}-N{num_slots}", make, b * h * k * v, atol=1e-5, rtol=1e-5,
                seed=seed, updates=(5,))


KDA = [
    kda_case(1, 2, 16, 16, 3),
    kda_case(3, 4, 32, 32, 8, seed=1),
    kda_case(8, 2, 16, 24, 9, seed=2),     # V not a power of two
    kda_case(2, 3, 20, 8, 2, seed=3),      # K not a power of two; every slot used
]


def paged_mla_case(lengths: list[int], h: int, r: int, p: int, block: int, seed=0) -> Case:
    """paged_mla_decode: rows of the given lengths on shuffled blocks of a pool, tables padded
    with -1 past each row's blocks (and one column past the longest), free blocks NaN, and the
    rows of a row's last block past its length large (finite: the pool zeroes what it hands out)."""
    def make(gen):
        need = [-(-n // block) for n in lengths]
        num_blocks = sum(need) + 2
        pool = torch.randn((num_blocks, block, r + p), generator=gen)
        order = torch.randperm(num_blocks, generator=gen)
        tables = torch.full((len(lengths), max(need) + 1), -1, dtype=torch.int64)
        for b, ids in enumerate(order[:sum(need)].split(need)):
            tables[b, :len(ids)] = ids
            pool[ids[-1], (lengths[b] - 1) % block + 1:] = 1e3
        pool[order[sum(need):]] = float("nan")
        q_lat = torch.randn((len(lengths), h, r), generator=gen)
        q_rope = torch.randn((len(lengths), h, p), generator=gen)
        return q_lat, q_rope, pool, tables, torch.tensor(lengths), (r + p) ** -0.5
    return Case(f"B{len(lengths)}-H{h}-R{r}-P{p}-BLOCK{block}-L{'_'.join(map(str, lengths))}",
                make, sum(lengths) * h * (r + p), atol=1e-5, rtol=1e-4, seed=seed)


PAGED_MLA = [
    paged_mla_case([1], 2, 16, 8, 16),                                # one key
    paged_mla_case([5, 16, 17, 1], 3, 32, 16, 16, seed=1),            # block edges, odd heads
    paged_mla_case([33, 2, 48, 9, 1, 20, 64, 15], 4, 24, 8, 16, seed=2),  # B = 8, R not 2^k
    paged_mla_case([70, 3], 2, 64, 32, 64, seed=3),                   # blocks of 64
    paged_mla_case([100], 17, 16, 8, 16, seed=4),                     # two head blocks
    # the Triton variant's key ranges (128 keys at least): 9 per row here, 76 keys in the last
    # of the long row's, the rest of the short rows' empty
    paged_mla_case([1100, 5, 300, 1], 2, 24, 8, 16, seed=5),
    paged_mla_case([700, 64], 3, 40, 8, 64, seed=6),                  # 6 ranges, blocks of 64
]


def llama_layer_case(positions: list[int], d: int, heads: int, kv_heads: int, hd: int,
                     inner: int, gemv="w4a16_gemv", symmetric=False, seed=0) -> Case:
    """llama_decode_layer: row b at positions[b] of its own cache (S_max a little past it),
    cache rows before it random, the row itself and those after it 1e3 (finite, so a read
    past the position shows as a wrong softmax rather than a NaN the harness would blame)."""
    from engined.layers.rope import RotaryEmbedding
    from engined.ops.llama_decode_layer.reference import LlamaLayer

    def linear(gen, n, k):  # weights ~ 1/sqrt(k), so activations stay near unit size
        parts = random_int4(gen, n, k, 32, symmetric=symmetric)
        scale = 4 / k ** 0.5
        parts["scales"] = (parts["scales"].float() * scale).half()
        if parts["mins"] is not None:
            parts["mins"] = (parts["mins"].float() * scale).half()
        w = PackedInt4(group_size=32, **parts)
        return int4_format.to_tiles(w) if gemv == "w4a8_tiles" else w

    def make(gen):
        rows = len(positions)
        h = torch.randn((rows, d), generator=gen)
        norms = [1 + 0.1 * torch.randn(d, generator=gen) for _ in range(2)]
        layer = LlamaLayer(norms[0], norms[1], 1e-5, linear(gen, (heads + 2 * kv_heads) * hd, d),
                           linear(gen, d, heads * hd), linear(gen, 2 * inner, d),
                           linear(gen, d, inner), heads, kv_heads, hd, gemv)
        kv = []
        for pos in positions:
            cache = torch.full((2, pos + 3, kv_heads, hd), 1e3, dtype=torch.float16)
            cache[:, :pos] = torch.randn((2, pos, kv_heads, hd), generator=gen).half()
            kv.append(cache)
        cos, sin = RotaryEmbedding(hd, 10000.0).at_positions(positions)
        return h, layer, cos.clone(), sin.clone(), kv, list(positions)
    kind = f"{gemv.removesuffix('_gemv').replace('_', '-')}{kind_tag(symmetric)}"
    return Case(f"B{len(positions)}-D{d}-H{heads}-KVH{kv_heads}-hd{hd}-F{inner}-{kind}-"
                f"P{'_'.join(map(str, positions))}", make, d * inner * 3,
                atol=2e-4, rtol=1e-4, seed=seed, updates=(4,))


LLAMA_LAYER = [
    llama_layer_case([0], 64, 4, 2, 16, 96),                               # the first token
    llama_layer_case([5, 70, 0], 64, 4, 2, 16, 96, seed=1),                # > one key chunk
    llama_layer_case([3, 1, 4, 1, 5, 9, 2, 6], 96, 6, 2, 32, 64, seed=2),  # B = 8, groups of 3
    llama_layer_case([130], 64, 2, 2, 32, 96, "w4a16_gemv", True, seed=3),  # no GQA, symmetric
    llama_layer_case([0], 64, 4, 2, 16, 96, "w4a8_gemv", seed=4),
    llama_layer_case([7, 66, 2], 96, 6, 3, 16, 160, "w4a8_gemv", seed=5),
    llama_layer_case([40], 576, 9, 3, 64, 1536, "w4a8_gemv", seed=6),     # SmolLM2 shapes
    # long rows: keys cut into ranges (256 at least, 16 at most per KV head) and merged
    llama_layer_case([300, 5, 1100], 64, 4, 2, 16, 96, seed=7),
    llama_layer_case([4200], 64, 8, 2, 8, 96, "w4a8_gemv", seed=8),       # 16 ranges of 263
    llama_layer_case([700], 64, 8, 2, 12, 96, seed=9),                    # hd 12: portable loads
    llama_layer_case([3, 9, 0], 64, 4, 2, 16, 96, "w4a8_tiles", seed=10),
    llama_layer_case([40, 41, 42, 43, 44], 576, 9, 3, 64, 1536, "w4a8_tiles", True, seed=11),
    # AVX2 attention: groups of 5 (a pass of 3 heads, then 2), hd 40 (32 elements a pass, then
    # 8); a long row's task takes every KV head, a short one's a KV head each
    llama_layer_case([900, 33], 64, 20, 4, 40, 96, seed=12),
    llama_layer_case([600], 64, 40, 4, 8, 96, seed=13),   # 40 heads: over a task's 32
    # AVX-512 attention (hd % 16 == 0): groups of 4 (3 heads, then 1), long rows in ranges,
    # keys past the last 8 (the AVX2 kernel's); hd 48, a pass of 3 x 16 elements
    llama_layer_case([300, 5, 1100], 64, 8, 2, 32, 96, "w4a8_tiles", seed=14),
    llama_layer_case([77, 130], 96, 4, 1, 48, 64, "w4a8_tiles", seed=15),
]


CASES["kda_step"] = KDA
CASES["paged_mla_decode"] = PAGED_MLA
CASES["llama_decode_layer"] = LLAMA_LAYER
