"""numpy conveniences: arrays in, new arrays out (the known-answer tests, and dequantizing).
The same kernels as int4.py's, over tensors that share the arrays' memory."""
from __future__ import annotations

from engined.helper.core import MAX_ROWS, np, require, torch
from engined.helper.int4 import Int4Weight, gemv, grouped_gemv, int4_weight, moe_swiglu, unpack


def _tensor(a, dtype):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=dtype))


def _packed_arrays(qweight, scales, mins, group) -> Int4Weight:
    return int4_weight(_tensor(qweight, np.uint8), _tensor(scales, np.float16),
                       None if mins is None else _tensor(mins, np.float16), group)


def unpack_int4(qweight, scales, mins, group: int, threads: int | None = None) -> np.ndarray:
    """Packed INT4 -> fp32. qweight: [N, K/2] uint8; scales, mins: [N, K/G] fp16 (mins None:
    symmetric) -> [N, K] fp32."""
    require()
    return unpack(_packed_arrays(qweight, scales, mins, group), None, threads).numpy()


def gemv_w4a16(x, qweight, scales, mins, group: int, threads: int = 1) -> np.ndarray:
    """y[M, N] = x[M, K] @ W^T, W packed INT4 (qweight [N, K/2], scales/mins [N, K/G]);
    1 <= M <= MAX_ROWS."""
    require()
    x = _tensor(x, np.float32)
    if x.dim() != 2 or x.shape[1] != 2 * np.shape(qweight)[-1]:
        raise ValueError(f"bad GEMV shapes: x {tuple(x.shape)}, qweight {np.shape(qweight)}")
    if not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"x has {x.shape[0]} rows; gemv_w4a16 takes 1..{MAX_ROWS}")
    return gemv(_packed_arrays(qweight, scales, mins, group), x, None, int(threads)).numpy()


def grouped_gemv_w4a16(x, expert_ids, stack: tuple, group: int, threads: int = 1) -> np.ndarray:
    """out[r] = x[r or 0] @ W[expert_ids[r]]^T; stack = (qweight [E,N,K/2], scales, mins)."""
    return _routed_arrays(grouped_gemv, x, expert_ids, [stack], group, threads)


def moe_swiglu_w4a16(x, expert_ids, gate: tuple, up: tuple, group: int,
                     threads: int = 1) -> np.ndarray:
    """out[r] = silu(x_r @ G_e^T) * (x_r @ U_e^T), e = expert_ids[r]."""
    return _routed_arrays(moe_swiglu, x, expert_ids, [gate, up], group, threads)


def _routed_arrays(call, x, expert_ids, stacks, group, threads):
    require()
    for qweight, scales, mins in stacks:
        if np.ndim(qweight) != 3:
            raise ValueError(f"bad expert stack: qweight {np.shape(qweight)}, scales "
                             f"{np.shape(scales)}, group {group}")
    weights = [_packed_arrays(*stack, group) for stack in stacks]
    x, ids = _tensor(x, np.float32), _tensor(expert_ids, np.int64)
    return call(*weights, x, ids, None, int(threads)).numpy()
