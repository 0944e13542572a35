"""paged_mla_decode in Triton, flash-decoding style (FlashInfer's and flash-decoding's split-K):
each row's keys are cut into NUM_SPLITS ranges along the sequence, one program per (row,
BLOCK_H heads, range) runs an online softmax over its range in tiles of TILE_S positions, each
tile found through the row's block table, and writes a partial (running max, sum, and the
unnormalized fp32 accumulator [BLOCK_H, R]); a second small kernel merges each (row, head)'s
partials into out. No gather, no host sync (ranges come from the row's length, read on the
device), so a CUDA graph can hold both.

The split rule (`num_splits`): NUM_SPLITS is static, from the shapes only (a CUDA graph replays
one grid): enough programs to fill the GPU several times (B * head blocks * NUM_SPLITS >=
TARGET_PROGRAMS), no more ranges than the most keys a row can have (block_tables.shape[1] *
BLOCK) fills with MIN_SPLIT_KEYS each, and at most MAX_SPLITS. On the device a row of n keys
takes ranges of max(MIN_SPLIT_KEYS, cdiv(n, NUM_SPLITS)) keys, rounded up to TILE_S; a range
starting at or past n writes an empty partial (max -inf, sum 0, no accumulator), which the merge
weighs by zero without reading its accumulator. At batch 1 and 32k keys that is 64 ranges of
512 keys for each of the 2 head blocks, where one program per head block walked all 32k before
(H200, graph replay: 4.1 ms then, 29 us now; 12 us at 1k keys).

Memory traffic per row: its S latent rows read once per head block ((R+P) * itemsize each:
1,152 B in bf16 at R+P = 576); with H = 32 and BLOCK_H = 16 two programs read each range, the
second mostly from L2. The partials add H * R * 4 B written and read per used range (64 KiB at
H = 32, R = 512: 57 keys' worth of bf16 latents, mostly in L2; MIN_SPLIT_KEYS = 128 measured
faster at 1k keys than 256). The products run in the pool's dtype (bf16 on the GPU: tensor
cores, as FlashMLA) with fp32 accumulation.
"""
import math

import torch
import triton
import triton.language as tl

from engined.ops import registry
from engined.ops.paged_mla_decode.reference import check_inputs

TARGET_PROGRAMS = 4 * 132   # four waves of an H100/H200's 132 SMs
MIN_SPLIT_KEYS = 128        # a range's keys outweigh its partial (see above)
MAX_SPLITS = 64


@triton.jit
def paged_mla_decode_kernel(q_lat_ptr, q_rope_ptr, pool_ptr, tables_ptr, lengths_ptr, m_ptr,
                            l_ptr, acc_ptr, scale, H, MB, sq_row, sq_head, sr_row, sr_head,
                            R: tl.constexpr, P: tl.constexpr,
                            BLOCK: tl.constexpr, NUM_SPLITS: tl.constexpr,
                            MIN_SPLIT: tl.constexpr, TILE_S: tl.constexpr, BLOCK_H: tl.constexpr,
                            BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr):
    row, split = tl.program_id(0), tl.program_id(2)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_r, offs_p, offs_s = tl.arange(0, BLOCK_R), tl.arange(0, BLOCK_P), tl.arange(0, TILE_S)
    h_mask, r_mask, p_mask = offs_h < H, offs_r < R, offs_p < P
    kdt = pool_ptr.dtype.element_ty
    q_at = row.to(tl.int64) * sq_row + offs_h[:, None].to(tl.int64) * sq_head   # strided rows
    r_at = row.to(tl.int64) * sr_row + offs_h[:, None].to(tl.int64) * sr_head   # and heads
    q = tl.load(q_lat_ptr + q_at + offs_r[None, :], mask=h_mask[:, None] & r_mask[None, :],
                other=0.0).to(tl.float32) * scale                    # [BLOCK_H, BLOCK_R]
    qr = tl.load(q_rope_ptr + r_at + offs_p[None, :], mask=h_mask[:, None] & p_mask[None, :],
                 other=0.0).to(tl.float32) * scale                   # [BLOCK_H, BLOCK_P]
    q, qr = q.to(kdt), qr.to(kdt)
    n = tl.load(lengths_ptr + row)
    keys = tl.maximum(tl.cdiv(tl.cdiv(n, NUM_SPLITS), TILE_S) * TILE_S, MIN_SPLIT)
    start = split * keys                                             # a multiple of TILE_S
    end = tl.minimum(start + keys, n)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_R], tl.float32)
    for first in range(start, end, TILE_S):                          # TILE_S divides BLOCK
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
    part = (row * H + offs_h).to(tl.int64) * NUM_SPLITS + split      # [BLOCK_H]
    tl.store(m_ptr + part, m, mask=h_mask)
    tl.store(l_ptr + part, total, mask=h_mask)
    # an empty range stores no accumulator (a [BLOCK_H] mask: the interpreter refuses a scalar)
    used = h_mask & (start + 0 * offs_h < n)
    tl.store(acc_ptr + part[:, None] * R + offs_r[None, :], acc, mask=used[:, None] & r_mask[None, :])


@triton.jit
def paged_mla_merge_kernel(m_ptr, l_ptr, acc_ptr, o_ptr, R: tl.constexpr,
                           NUM_SPLITS: tl.constexpr, BLOCK_SPLITS: tl.constexpr,
                           BLOCK_R: tl.constexpr):
    # one program per (row * H + head, BLOCK_R latent columns): reads NUM_SPLITS maxes and sums,
    # the used ranges' [BLOCK_R] accumulators, writes BLOCK_R of out
    head = tl.program_id(0).to(tl.int64)
    offs_r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_k = tl.arange(0, BLOCK_SPLITS)
    r_mask, k_mask = offs_r < R, offs_k < NUM_SPLITS
    part = head * NUM_SPLITS + offs_k
    m = tl.load(m_ptr + part, mask=k_mask, other=float("-inf"))    # [BLOCK_SPLITS]
    total = tl.load(l_ptr + part, mask=k_mask, other=0.0)
    weight = tl.exp(m - tl.max(m, axis=0))                           # empty ranges: exp(-inf) = 0
    used = weight > 0
    acc = tl.load(acc_ptr + part[:, None] * R + offs_r[None, :],
                  mask=used[:, None] & r_mask[None, :], other=0.0)  # [BLOCK_SPLITS, BLOCK_R]
    o = tl.sum(weight[:, None] * acc, axis=0) / tl.sum(weight * total, axis=0)
    tl.store(o_ptr + head * R + offs_r, o.to(o_ptr.dtype.element_ty), mask=r_mask)


def num_splits(rows: int, head_blocks: int, max_keys: int) -> int:
    """Ranges per row, from static shapes only (see the module docstring)."""
    fill = triton.cdiv(TARGET_PROGRAMS, rows * head_blocks)
    return max(1, min(fill, triton.cdiv(max_keys, MIN_SPLIT_KEYS), MAX_SPLITS))


def pick_config(h: int, r: int, p: int, block: int, itemsize: int) -> dict:
    """Heads in blocks of 16 (tl.dot's smallest M); keys in tiles of 64 from a 2-byte pool, 32
    from an fp32 one (a divisor of BLOCK): a stage of bf16 latents is 72 KiB at R+P = 576, two
    stages in flight. Measured on an H200 (bf16, H = 32, graph replay): tiles of 64 keys and 4
    warps ran batch 1 at 32k keys in 29 us, tiles of 16 and 8 warps in 72 us."""
    tile = math.gcd(block, 64 if itemsize <= 2 else 32)
    return dict(BLOCK_H=16, TILE_S=tile, BLOCK_R=max(16, triton.next_power_of_2(r)),
                BLOCK_P=max(16, triton.next_power_of_2(p)), num_warps=4, num_stages=2)


def pick_merge_config(r: int, splits: int) -> dict:
    """All of a head's ranges in one tile of <= 4K fp32 accumulator entries per program."""
    block_splits = triton.next_power_of_2(splits)
    return dict(BLOCK_SPLITS=block_splits,
                BLOCK_R=min(triton.next_power_of_2(r), max(16, 4096 // block_splits)))


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
    if q_lat.stride(2) != 1 or q_rope.stride(2) != 1:
        raise registry.KernelError("paged_mla_decode: q_lat's and q_rope's last dims must be "
                                   "contiguous (rows and heads may be strided views)")
    tables = block_tables.to(torch.int64).contiguous()
    lengths = lengths.to(torch.int64).contiguous()
    if out is not None and (out.shape != (b, h, r) or not out.is_floating_point()
                            or not out.is_contiguous()):
        raise registry.KernelError(f"paged_mla_decode: out must be a contiguous float [{b}, {h}, {r}]")
    o = torch.empty((b, h, r), dtype=torch.float32, device=q_lat.device) if out is None else out
    cfg = pick_config(h, r, p, block, pool.element_size())
    tile = cfg["TILE_S"]
    head_blocks = triton.cdiv(h, cfg["BLOCK_H"])
    splits = num_splits(b, head_blocks, tables.shape[1] * block)
    # the partials: per (row, head, range) a max, a sum and an accumulator [R]
    m, total = (torch.empty((b, h, splits), dtype=torch.float32, device=o.device) for _ in range(2))
    acc = torch.empty((b, h, splits, r), dtype=torch.float32, device=o.device)
    paged_mla_decode_kernel[(b, head_blocks, splits)](
        q_lat, q_rope, pool, tables, lengths, m, total, acc, scale, h, tables.shape[1],
        q_lat.stride(0), q_lat.stride(1), q_rope.stride(0), q_rope.stride(1), R=r, P=p,
        BLOCK=block, NUM_SPLITS=splits, MIN_SPLIT=triton.cdiv(MIN_SPLIT_KEYS, tile) * tile, **cfg)
    merge = pick_merge_config(r, splits)
    paged_mla_merge_kernel[(b * h, triton.cdiv(r, merge["BLOCK_R"]))](
        m, total, acc, o, R=r, NUM_SPLITS=splits, **merge)
    return o
