"""The one wrapper over the C helper: the only package that touches the cffi `lib` and `ffi`.

The compiled module is `engined._kimi_helper`, built from csrc/ by `_helper_build.py` at
install. As with bcrypt's wrapper, every C entry point has one Python function here that
validates its inputs, allocates or accepts the buffers and maps the status code to an
exception; the ops (engined/ops/*/cpu_c.py) and layers call these functions, never `lib`
(tests/ops/test_helper_boundary.py checks). Buffers are CPU torch tensors. Callers import
the package (`from engined import helper`); its modules, re-exported here, are:

- core.py: the compiled module or why it is missing (`available`, `require`), `check`
  (status -> HelperError / MemoryCapExceeded), `MAX_ROWS` (KH_MAX_ROWS from C: rows of x
  one GEMV pass handles) and the fp32 buffers and per-thread workspace. Every workspace
  size comes from the C side; nothing of the C layout is copied here.
- int4.py: `int4_weight` validates a packed INT4 weight (or a stack of experts; mins None
  for a symmetric one, format version 2) once and returns an `Int4Weight` holding its C
  pointers; the hot calls `gemv`, `grouped_gemv` and `moe_swiglu` (and `moe_grouped`, the
  multi-row MoE) take that handle, so a decode GEMV costs a few microseconds of Python.
  `gemv_w4a8` is `gemv` with x quantized to int8 per block of 32 (`w4a8_simd` says which
  kernel runs); `tiles_w4a8` the same for a linear in the CPU's tiles, any row count
  (`tiles_w4a16` with x rounded to int16 instead). `gemm` is the prefill GEMM (any row count, W decoded tile by tile, never
  whole). `unpack` dequantizes a handle to fp32; `tile_int4` puts packed tensors into the
  CPU's tiles in place (or back).
- dense.py: `gemv_f16` is the fp16 LM head, `gemv_bf16` the bf16 one, `gemv_q8` the Q8_0 one
  (`tiles_q8` the same in the CPU's tiles, any row count), `q8_embed` the Q8_0 table's lookup.
- kda.py: `kda_weights` makes a Kimi-Linear KDA layer's handle once (fp32 copies, f_b and
  g_b transposed), `kda_decode_rows` runs a decode step's rows on the state pools.
- llama.py: `llama_layer` / `llama_decode_layer` run one Llama decoder layer per call, and
  `llama_decode_layers` every layer of a decode step (validated once per step).
- arrays.py: `unpack_int4`, `gemv_w4a16`, `grouped_gemv_w4a16`, `moe_swiglu_w4a16`: the
  same kernels on numpy arrays, returning new arrays (the known-answer tests, and
  dequantizing).
- system.py: the SIMD caps (`gemv_simd`; `w4a8_simd` for the integer-dot kernels; `moe_int16`
  says where moe_grouped's W4A16 dots are integer ones; `tiles_amx` whether tiles_w4a8 runs
  7+ rows, and tiles_q8 6+, on Intel AMX), `read_probe`, `pool_stats`, and
  memcap_*: the process-wide reservation budget. What the kernel will grant (cgroup limit,
  RSS) is engine/memory.py's.

`threads` counts the caller plus the helper's own pool threads (csrc/kimi_pool.c).
"""
from engined.helper.core import (  # noqa: F401
    _IMPORT_ERROR, F32, KEEP_WORKSPACE_FLOATS, MAX_ROWS, HelperError, MemoryCapExceeded,
    _as_rows, _header_max_rows, _local, _out, _workspace, available, check, default_threads,
    ffi, lib, np, require, torch)
from engined.helper.int4 import (  # noqa: F401
    Int4Weight, _routed, _row_passes, gemm, gemv, gemv_w4a8, grouped_gemv, int4_weight,
    moe_grouped, moe_swiglu, tile_int4, tiles_w4a16, tiles_w4a8, unpack)
from engined.helper.dense import (  # noqa: F401
    _gemv_h16, gemv_bf16, gemv_f16, gemv_q8, q8_embed, q8_simd, tiles_q8)
from engined.helper.kda import KdaWeights, kda_decode_rows, kda_weights  # noqa: F401
from engined.helper.llama import (  # noqa: F401
    LlamaLayerHandle, llama_decode_layer, llama_decode_layers, llama_layer)
from engined.helper.arrays import (  # noqa: F401
    _packed_arrays, _routed_arrays, _tensor, gemv_w4a16, grouped_gemv_w4a16, moe_swiglu_w4a16,
    unpack_int4)
from engined.helper.system import (  # noqa: F401
    INT8_LEVELS, SIMD_LEVELS, attention_simd, gemv_simd, memcap_cap, memcap_init, memcap_peak,
    memcap_release, memcap_reserve, memcap_reserved, moe_int16, pool_stats, read_probe,
    tiles_amx, tiles_amx_calls, tiles_kernels, tiles_simd, w4a8_simd)
