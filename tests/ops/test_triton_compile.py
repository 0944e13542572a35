"""The Triton kernels compile for a real GPU target (sm_90 PTX + cubin) with no GPU here.

The equivalence tests run the kernels under TRITON_INTERPRET=1, which accepts some
code the compiler refuses; this checks the compiled path too. It runs in a child
process because TRITON_INTERPRET is read when the kernels are decorated.
"""
import importlib.metadata
import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = r"""
import os, sys
import triton
from triton import compile as triton_compile
STRICT_DISK_ORDER = os.environ["KIMI_TRITON_FLAVOUR"] == "ci"
SM90_SHARED = 232448  # bytes of shared memory one block may have on sm_90 (227 KiB)
print("triton", triton.__version__, "from", triton.__file__)
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from engined.ops.w4a16_gemv.triton import pick_config as gemv_config, w4a16_gemv_kernel
from engined.ops.moe_decode.triton import moe_down_kernel, moe_gate_up_kernel
from engined.ops.add_rmsnorm.triton import add_rmsnorm_kernel
from engined.ops.w4a16_grouped_gemv.triton import w4a16_grouped_gemv_kernel
from engined.ops.moe_swiglu.triton import moe_swiglu_kernel
from engined.ops.moe_grouped.triton import moe_grouped_kernel
from engined.ops.kda_step.triton import kda_step_kernel
from engined.ops.kda_decode.triton import NUM_WARPS, kda_decode_kernel
from engined.ops.paged_mla_decode.triton import (paged_mla_decode_kernel, paged_mla_merge_kernel,
                                                 pick_config, pick_merge_config)
from engined.ops.mla_latent.triton import mla_latent_kernel
from engined.ops.w4a16_gemm.triton import pick_config as gemm_config, w4a16_gemm_kernel
from engined.ops.moe_grouped.triton_dot import moe_grouped_dot_kernel, pick_config as moe_dot_config
from engined.ops.gated_rmsnorm.triton import BLOCK_ROWS, gated_rmsnorm_kernel
from engined.ops.moe_route.triton import moe_route_kernel
from engined.ops.short_conv.triton import BLOCK_C as CONV_C, BLOCK_T as CONV_T, short_conv_kernel
import triton.language as tl

GEMV = {"GROUP": 32, "HAS_MINS": False}
W = {"c_ptr": "*i32", "s_ptr": "*fp16", "m_ptr": "*fp16"}
TAIL = {"y_ptr": "*bf16", "N": "i32", "K": "i32"}
cases = []
INNER_LOOPS_CLEAN = set()  # kernels whose innermost loops must hold no barrier or shared memory
for has_mins in (True, False):  # asymmetric, symmetric (format version 2: no mins)
    for n, k in ((12288, 2304), (2304, 4096)):  # q/k/v stacked; o_proj
        META = {"GROUP": 32, "HAS_MINS": has_mins, "GPU_ORDER": True, **tile(n, k)}
        for swiglu in (False, True):
            cases.append((w4a16_gemv_kernel, {"x_ptr": "*bf16", **W, **TAIL},
                          {**META, "SWIGLU": swiglu}))
    cases.append((w4a16_gemv_kernel, {"x_ptr": "*fp32", **W, **TAIL},  # the disk's code order
                  {**META, "SWIGLU": False, "GPU_ORDER": False}))
    META = {"GROUP": 32, "HAS_MINS": has_mins, "GPU_ORDER": True, **tile(1024, 2304)}
    for per_route in (True, False):
        meta = {"X_PER_ROUTE": per_route, **META}
        cases.append((w4a16_grouped_gemv_kernel,
                      {"x_ptr": "*fp32", "ids_ptr": "*i64", "q_ptr": "*i32", "s_ptr": "*fp16",
                       "m_ptr": "*fp16", **TAIL}, meta))
        swiglu = {"x_ptr": "*fp32", "ids_ptr": "*i64", "gq_ptr": "*i32", "gs_ptr": "*fp16",
                  "gm_ptr": "*fp16", "uq_ptr": "*i32", "us_ptr": "*fp16", "um_ptr": "*fp16", **TAIL}
        cases.append((moe_swiglu_kernel, swiglu, meta))
    grouped = {"x_ptr": "*fp32", "token_ptr": "*i64", "offsets_ptr": "*i64", "aq_ptr": "*i32",
               "as_ptr": "*fp16", "am_ptr": "*fp16", "bq_ptr": "*i32", "bs_ptr": "*fp16",
               "bm_ptr": "*fp16", **TAIL}
    for gather, swiglu in ((True, True), (False, False)):  # gate/up, then down
        cases.append((moe_grouped_kernel, grouped, {"GATHER": gather, "SWIGLU": swiglu, **META}))
    # the decode MoE at Kimi-Linear's shapes: 256 experts, top-8, a shared expert
    routing = {"TOP_K": 8, "RENORM": True, "SHARED": True, "GROUP": 32, "HAS_MINS": has_mins,
               "BLOCK_E": 256, "BLOCK_K": 8, "GPU_ORDER": True}
    gate_up = {"x_ptr": "*bf16", "logits_ptr": "*fp32", "bias_ptr": "*fp32"}
    for prefix in ("g", "u", "s"):
        gate_up.update({f"{prefix}q_ptr": "*i32", f"{prefix}s_ptr": "*fp16", f"{prefix}m_ptr": "*fp16"})
    gate_up.update({"h_ptr": "*fp32", "E": "i32", "N": "i32", "K": "i32", "scaling": "fp32"})
    cases.append((moe_gate_up_kernel, gate_up, {**routing, **tile(1024, 2304)}))
    down = {"h_ptr": "*fp32", "logits_ptr": "*fp32", "bias_ptr": "*fp32"}
    for prefix in ("d", "s"):
        down.update({f"{prefix}q_ptr": "*i32", f"{prefix}s_ptr": "*fp16", f"{prefix}m_ptr": "*fp16"})
    down.update({"y_ptr": "*bf16", "E": "i32", "N": "i32", "K": "i32", "scaling": "fp32"})
    cases.append((moe_down_kernel, down, {**routing, **tile(2304, 1024)}))
INNER_LOOPS_CLEAN |= {w4a16_gemv_kernel, w4a16_grouped_gemv_kernel, moe_swiglu_kernel,
                      moe_gate_up_kernel, moe_down_kernel}
norm = {"h_ptr": "*bf16", "d_ptr": "*bf16", "w_ptr": "*bf16", "o_ptr": "*bf16", "D": "i32",
        "eps": "fp32"}
cases.append((add_rmsnorm_kernel, norm, {"HAS_DELTA": True, "BLOCK_D": 4096}))  # hidden 2304
kda = {"q_ptr": "*fp32", "k_ptr": "*fp32", "v_ptr": "*fp32", "g_ptr": "*fp32", "beta_ptr": "*fp32",
       "s_ptr": "*fp32", "slots_ptr": "*i64", "o_ptr": "*fp32", "scale": "fp32", "H": "i32"}
cases.append((kda_step_kernel, kda, {"K": 128, "V": 128, "BLOCK_K": 128, "BLOCK_V": 64}))  # Kimi-Linear
kda_decode = {"qkv_ptr": "*bf16", "low_ptr": "*bf16", "fb_ptr": "*bf16", "gb_ptr": "*bf16",
              "cw_ptr": "*bf16", "conv_ptr": "*bf16", "s_ptr": "*fp32", "slots_ptr": "*i64",
              "a_log_ptr": "*fp32", "dt_ptr": "*fp32", "nw_ptr": "*bf16", "y_ptr": "*bf16",
              "eps": "fp32", "scale": "fp32", "H": "i32"}   # Kimi-Linear: H = 32, W = 4096, bf16
cases.append((kda_decode_kernel, kda_decode, {"K": 128, "V": 128, "C": 4, "L2_EPS": 1e-6,
                                              "BLOCK_K": 128, "BLOCK_V": 128, "BLOCK_C": 4}))
OPTIONS = {kda_decode_kernel: {"num_warps": NUM_WARPS}}  # as launched (default: 4 warps)
for pool in ("*bf16", "*fp32"):  # the served bf16 pool (tensor cores), the fp32 CPU-dtype pool
    mla = {"q_lat_ptr": "*bf16", "q_rope_ptr": "*bf16", "pool_ptr": pool, "tables_ptr": "*i64",
           "lengths_ptr": "*i64", "m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32",
           "scale": "fp32", "H": "i32", "MB": "i32", "sq_row": "i32", "sq_head": "i32",
           "sr_row": "i32", "sr_head": "i32"}
    cfg = {k: v for k, v in pick_config(32, 512, 64, 64, 2 if pool == "*bf16" else 4).items()
           if not k.startswith("num_")}
    cases.append((paged_mla_decode_kernel, mla, {"R": 512, "P": 64, "BLOCK": 64, "NUM_SPLITS": 64,
                                                 "MIN_SPLIT": 128, **cfg}))  # Kimi-Linear
for splits in (64, 33):  # batch 1 and batch 8 at H = 32
    merge = {"m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32", "o_ptr": "*bf16"}
    cases.append((paged_mla_merge_kernel, merge, {"R": 512, "NUM_SPLITS": splits,
                                                  **pick_merge_config(512, splits)}))
latent = {"kv_ptr": "*bf16", "w_ptr": "*bf16", "pool_ptr": "*bf16", "tables_ptr": "*i64",
          "positions_ptr": "*i64", "o_ptr": "*bf16", "eps": "fp32", "MB": "i32"}
cases.append((mla_latent_kernel, latent, {"R": 512, "P": 64, "BLOCK": 64, "SCALE_IN_ACT": True,
                                          "BLOCK_R": 512, "BLOCK_P": 64}))  # Kimi-Linear, bf16
gemm = {"x_ptr": "*bf16", "c_ptr": "*i32", "s_ptr": "*fp16", "m_ptr": "*fp16", "y_ptr": "*bf16",
        "M": "i32", "N": "i32", "K": "i32"}   # prefill rows: a 256-token chunk, bf16 activations
cfg = gemm_config(256, 32)                    # (the tile does not depend on N or K)
OPTIONS[w4a16_gemm_kernel] = {k: cfg.pop(k) for k in ("num_warps", "num_stages")}
for has_mins in (True, False):
    for gpu_order in (True, False):
        cases.append((w4a16_gemm_kernel, gemm, {"GROUP": 32, "HAS_MINS": has_mins, "IEEE": False,
                                                "GPU_ORDER": gpu_order, "INTERPRETED": False, **cfg}))
cfg = moe_dot_config(32)                      # prefill MoE: bf16 rows, then fp32 SwiGLU rows
OPTIONS[moe_grouped_dot_kernel] = {k: cfg.pop(k) for k in ("num_warps", "num_stages")}
for gather, x_type in ((True, "*bf16"), (False, "*fp32")):   # gate/up, then down
    moe_dot = {"x_ptr": x_type, "token_ptr": "*i64", "offsets_ptr": "*i64", "aq_ptr": "*i32",
               "as_ptr": "*fp16", "am_ptr": "*fp16", "bq_ptr": "*i32", "bs_ptr": "*fp16",
               "bm_ptr": "*fp16", "y_ptr": "*fp32", "N": "i32", "K": "i32"}
    for has_mins in (True, False):
        cases.append((moe_grouped_dot_kernel, moe_dot, {
            "GATHER": gather, "SWIGLU": gather, "GROUP": 32, "HAS_MINS": has_mins, "GPU_ORDER": True,
            "IEEE": False, "A_EXACT": gather, "DTYPE": tl.bfloat16, "INTERPRETED": False, **cfg}))
# prefill chunks around chunk_kda and the experts, Kimi-Linear's shapes, bf16 activations
gated = {"o_ptr": "*bf16", "z_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "R": "i32",
         "K": "i32", "eps": "fp32"}
cases.append((gated_rmsnorm_kernel, gated, {"BLOCK_R": BLOCK_ROWS, "BLOCK_K": 128}))
conv = {"x_ptr": "*bf16", "w_ptr": "*bf16", "win_ptr": "*bf16", "y_ptr": "*bf16", "T": "i32",
        "C": "i32", "CP": "i32"}
cases.append((short_conv_kernel, conv, {"W": 4, "BLOCK_T": CONV_T, "BLOCK_C": CONV_C, "BLOCK_W": 4}))
route = {"logits_ptr": "*fp32", "bias_ptr": "*fp32", "experts_ptr": "*i64", "weights_ptr": "*fp32",
         "E": "i32", "scaling": "fp32"}
cases.append((moe_route_kernel, route, {"TOP_K": 8, "RENORM": True, "BLOCK_E": 256, "BLOCK_K": 8}))
for fn, sig, meta in cases:
    # as a launch specializes them: pointers and K 16-byte aligned (vector loads)
    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, kind) in enumerate(sig.items())
             if kind.startswith("*") or name == "K"}
    sig = {**sig, **{name: "constexpr" for name in meta}}
    options = OPTIONS.get(fn, {"num_stages": 1} if fn in INNER_LOOPS_CLEAN else None)
    compiled = triton_compile(ASTSource(fn, sig, constexprs=meta, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options=options)
    assert fn.__name__ in compiled.asm["ptx"] and compiled.asm["cubin"], fn.__name__
    # shared memory is checked only when a GPU loads the kernel (OutOfResources): sm_90 lends
    # a block at most 227 KiB
    assert compiled.metadata.shared <= SM90_SHARED, (fn.__name__, meta, compiled.metadata.shared)
    # the disk's code order (GPU_ORDER false) is held to it where CI's triton compiles it:
    # the GPU's loader puts every INT4 weight it runs in the GPU order first
    if fn in INNER_LOOPS_CLEAN and (meta.get("GPU_ORDER", True) or STRICT_DISK_ORDER):
        loops = inner_loop_stalls(compiled.asm["cubin"])
        assert loops, f"{fn.__name__} {meta}: no loop found in its SASS (the reader is stale)"
        for loop, found in loops.items():
            assert not found, f"{fn.__name__} {meta}: its loop at {loop} holds {found}"
    print("compiled", fn.__name__, meta, "shared", compiled.metadata.shared)
print("cases", len(cases))
"""

# SASS helpers the script starts with: nvdisasm ships in the triton wheel.
SASS = r"""
import os, re, subprocess, tempfile
import triton
from engined.ops.w4a16_gemv.triton import pick_config as gemv_config


def tile(n, k):
    cfg = gemv_config(n, k, 32)
    return {"BLOCK_N": cfg["BLOCK_N"], "BLOCK_G": cfg["BLOCK_G"]}


def inner_loop_stalls(cubin):
    # innermost loops (a backward branch whose body holds no other) -> the barriers and
    # shared-memory loads and stores in them: a K loop must have none
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout
    at, labels, label = [], {}, None
    for line in text.splitlines():
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            label = m.group(1)
            continue
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            at.append((int(m.group(1), 16), m.group(2)))
            if label:
                labels[label], label = int(m.group(1), 16), None
    loops = [(labels[m.group(1)], addr) for addr, ins in at
             for m in [re.search(r"BRA[^`]*`\((\.L_x_\d+)\)", ins)]
             if m and labels.get(m.group(1), addr + 1) < addr]
    inner = [(a, b) for a, b in loops if not any(a < c and d < b for c, d in loops)]
    stall = re.compile(r"\b(BAR|LDS|STS)\b")
    return {f"{a:#x}-{b:#x}": sorted({stall.search(i).group(1) for x, i in at
                                       if a <= x <= b and stall.search(i)}) for a, b in inner}
"""


ROOT = pathlib.Path(__file__).resolve().parents[2]
GPU_TRITON = ROOT / ".triton-gpu"  # `make test` installs the GPU image's triton here (Makefile)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("flavour", ["ci", "gpu-image"])
def test_triton_kernels_compile_for_sm90(tmp_path, flavour):
    """Every kernel compiles at Kimi-Linear's shapes, and the INT4 GEMV family's innermost
    (K) loops hold no barrier and no shared-memory load or store (read from the SASS), under
    the triton CI pins (3.9) and the one the GPU machine's image has (3.6): the two lay a
    load's registers out differently, and the GPU runs the second."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), TRITON_HOME=str(tmp_path),
               TRITON_DEFAULT_FP_FUSION="1", KIMI_TRITON_FLAVOUR=flavour)
    want = {"ci": importlib.metadata.version("triton"), "gpu-image": None}[flavour]
    if flavour == "gpu-image":
        stamps = sorted(GPU_TRITON.glob(".triton-*"))
        if not stamps:
            pytest.skip(f"no GPU-image triton in {GPU_TRITON} (`make test` installs it)")
        want = stamps[-1].name.removeprefix(".triton-")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(GPU_TRITON), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", SASS + SCRIPT], env=env, capture_output=True,
                          text=True, timeout=220)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"triton {want} from "), done.stdout[:200]
    print(done.stdout.splitlines()[0])
    cases = int(done.stdout.rsplit("cases ", 1)[1])
    compiled = [line for line in done.stdout.splitlines() if line.startswith("compiled ")]
    assert len(compiled) == cases >= 34
