"""paged_mla_decode in Triton: one program per (row, BLOCK_H heads), an online softmax over the
row's keys in tiles of TILE_S positions, each tile found through the row's block table. No
gather, no host sync (the loop bound is the row's length, read on the device), so a CUDA graph
can hold it.

Memory traffic per row: its S latent rows read once per head block ((R+P) * itemsize each:
1,152 B in bf16 at R+P = 576), plus the block table entries; with H = 32 and BLOCK_H = 16 that
is two reads of the row's latents, the second mostly from L2. The latents dominate. The products
run in the pool's dtype (bf16 on the GPU: tensor cores, as FlashMLA) with fp32 accumulation.
"""
import torch
import triton
import triton.language as tl

from engined.ops import registry
from engined.ops.paged_mla_decode.reference import check_inputs


@triton.jit
def paged_mla_decode_kernel(q_lat_ptr, q_rope_ptr, pool_ptr, tables_ptr, lengths_ptr, o_ptr, scale,
                            H, MB, R: tl.constexpr, P: tl.constexpr, BLOCK: tl.constexpr,
                            TILE_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr,
                            BLOCK_P: tl.constexpr):
    row = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_r, offs_p, offs_s = tl.arange(0, BLOCK_R), tl.arange(0, BLOCK_P), tl.arange(0, TILE_S)
    h_mask, r_mask, p_mask = offs_h < H, offs_r < R, offs_p < P
    kdt = pool_ptr.dtype.element_ty
    at = (row * H + offs_h[:, None]).to(tl.int64)
    q = tl.load(q_lat_ptr + at * R + offs_r[None, :], mask=h_mask[:, None] & r_mask[None, :],
                other=0.0) * scale                                   # [BLOCK_H, BLOCK_R]
    qr = tl.load(q_rope_ptr + at * P + offs_p[None, :], mask=h_mask[:, None] & p_mask[None, :],
                 other=0.0) * scale                                  # [BLOCK_H, BLOCK_P]
    q, qr = q.to(kdt), qr.to(kdt)
    n = tl.load(lengths_ptr + row)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_R], tl.float32)
    for t in range(tl.cdiv(n, TILE_S)):
        first = t * TILE_S                                           # TILE_S divides BLOCK
        blk = tl.load(tables_ptr + row * MB + first // BLOCK).to(tl.int64)
        pos = first + offs_s
        live = pos < n
        at_key = pool_ptr + (blk * BLOCK + first % BLOCK + offs_s[:, None]) * (R + P)
        c = tl.load(at_key + offs_r[None, :], mask=live[:, None] & r_mask[None, :], other=0.0)
        kr = tl.load(at_key + R + offs_p[None, :], mask=live[:, None] & p_mask[None, :], other=0.0)
        s = tl.dot(q, tl.trans(c), input_precision="ieee") + tl.dot(qr, tl.trans(kr), input_precision="ieee")
        s = tl.where(live[None, :], s, float("-inf"))                # [BLOCK_H, TILE_S]
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kdt), c, input_precision="ieee")
        m = m_new
    o = acc / total[:, None]
    tl.store(o_ptr + at * R + offs_r[None, :], o, mask=h_mask[:, None] & r_mask[None, :])


def pick_config(h: int, r: int, p: int, block: int) -> dict:
    """Heads in blocks of 16 (tl.dot's smallest M), keys in tiles of 16: with R = 512 the fp32
    accumulator and a bf16 key tile take 32 + 16 KiB per program."""
    tile = min(16, block)
    return dict(BLOCK_H=16, TILE_S=tile, BLOCK_R=max(16, triton.next_power_of_2(r)),
                BLOCK_P=max(16, triton.next_power_of_2(p)), num_warps=4 if r <= 128 else 8)


def paged_mla_decode(q_lat, q_rope, pool, block_tables, lengths, scale: float,
                     out=None) -> torch.Tensor:
    check_inputs(q_lat, q_rope, pool, block_tables, lengths)
    b, h, r = q_lat.shape
    p, block = q_rope.shape[2], pool.shape[1]
    if not pool.is_contiguous():
        raise registry.KernelError("paged_mla_decode: the latent pool must be contiguous")
    if block % 16:
        raise registry.KernelError(f"paged_mla_decode: pool blocks of {block} rows; a multiple "
                                   f"of 16 is needed")
    q_lat, q_rope = (t.to(torch.float32).contiguous() for t in (q_lat, q_rope))
    tables = block_tables.to(torch.int64).contiguous()
    lengths = lengths.to(torch.int64).contiguous()
    if out is not None and (out.shape != (b, h, r) or out.dtype != torch.float32
                            or not out.is_contiguous()):
        raise registry.KernelError(f"paged_mla_decode: out must be a contiguous fp32 [{b}, {h}, {r}]")
    o = torch.empty((b, h, r), dtype=torch.float32, device=q_lat.device) if out is None else out
    cfg = pick_config(h, r, p, block)
    paged_mla_decode_kernel[(b, triton.cdiv(h, cfg["BLOCK_H"]))](
        q_lat, q_rope, pool, tables, lengths, o, scale, h, tables.shape[1], R=r, P=p, BLOCK=block,
        **cfg)
    return o
