"""Every Triton kernel the 48B's GPU path launches compiles for sm_90 under the GPU image's
Triton, at the shapes and specializations the path really launches, with no GPU here
(tests/support/gpu_step_compile.py, through the sm_90 stand-in of tests/support/sm90.py):

- the decode graph step of each batch bucket, at a short, a 32k and a 128k-token block table;
- prefill chunks of 2048 (a GPU's default), 256 and 7 tokens, fla-core's chunk_kda included,
  with every autotune config its autotuner would compile on the GPU before timing them;
- and each fits the shared memory an H200 block may opt into (a kernel over it fails at launch,
  not at compile time; an autotuned config over it is only skipped there, so in each autotuner
  call one must fit).

test_triton_compile.py compiles hand-listed cases and reads their SASS; this one finds what the
code launches, fla's kernels among it, which nothing else compiles before a GPU does.
"""
import json
import os
import subprocess
import sys

import pytest

from tests.ops.test_triton_compile import GPU_TRITON, ROOT
from tests.support import sm90

DECODE = {"w4a16_gemv_kernel", "add_rmsnorm_kernel", "moe_gate_up_kernel", "moe_down_kernel",
          "kda_decode_kernel", "mla_latent_kernel", "paged_mla_decode_kernel",
          "paged_mla_merge_kernel"}
FLA = {"l2norm_fwd_kernel", "fused_beta_sigmoid_fwd_kernel", "kda_gate_chunk_cumsum_vector_kernel",
       "chunk_kda_fwd_kernel_intra_token_parallel", "chunk_kda_fwd_kernel_inter_solve_fused",
       "recompute_w_u_fwd_kda_kernel", "chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
       "chunk_gla_fwd_kernel_o"}
PREFILL = {"prefill T2048": FLA | {"w4a16_gemm_kernel", "add_rmsnorm_kernel", "moe_grouped_dot_kernel"},
           "prefill T256": FLA | {"w4a16_gemm_kernel", "add_rmsnorm_kernel", "moe_grouped_dot_kernel"},
           # up to 8 rows: the decode GEMV and MoE kernels
           "prefill T7": FLA | {"w4a16_gemv_kernel", "moe_gate_up_kernel", "moe_down_kernel"}}


def compile_in_a_child(tmp_path) -> dict:
    """gpu_step_compile.py's JSON, run under the GPU image's triton with a fresh cache."""
    stamps = sorted(GPU_TRITON.glob(".triton-*"))
    if not stamps:
        pytest.skip(f"no GPU-image triton in {GPU_TRITON} (`make test` installs it)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), TRITON_HOME=str(tmp_path),
               TRITON_DEFAULT_FP_FUSION="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(GPU_TRITON), str(ROOT),
                                                        env.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "support" / "gpu_step_compile.py")],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["triton"] == stamps[-1].name.removeprefix(".triton-")
    return result


@pytest.mark.timeout(420)
def test_every_launch_of_the_decode_step_and_a_prefill_chunk_compiles_for_sm90(tmp_path):
    """One test, not two on one fixture: under xdist each worker would build the fixture."""
    compiled = compile_in_a_child(tmp_path)
    assert compiled["hopper"], "fla-core did not see a Hopper GPU: it would pick other kernels"
    phases = compiled["phases"]
    assert list(phases) == [f"decode B{b} S{s}" for b in (1, 2, 4, 8)
                            for s in (64, 32768, 131072)] + list(PREFILL)
    for name, launches in phases.items():
        kernels = {k for k, *_ in launches}
        want = DECODE if name.startswith("decode") else PREFILL[name]
        assert want <= kernels, f"{name}: {sorted(want - kernels)} not launched"
    print("\n".join(f"{name}: {len(launches)} launches, {len({k for k, *_ in launches})} kernels"
                    for name, launches in phases.items()))
    # shared memory: over the limit fails at launch (compiling does not check it); a config
    # over it is only skipped by the autotuner timing it, so in each autotuner call one must
    # fit (and have compiled: a config that failed to is skipped there too)
    fits_by_call: dict[tuple[str, int], list[bool]] = {}  # calls are numbered per phase
    for name, launches in phases.items():
        for kernel, _, shared, _, call in launches:
            if call:
                fits_by_call.setdefault((name, call), []).append(shared <= sm90.MAX_SHARED)
            else:
                assert shared <= sm90.MAX_SHARED, f"{name}: {kernel} asks {shared} bytes"
    assert fits_by_call, "no autotuner call: fla's chunk_kda did not tune"
    assert all(any(fits) for fits in fits_by_call.values()), \
        [call for call, fits in fits_by_call.items() if not any(fits)]
    print(f"{len(fits_by_call)} autotuner calls; configs skipped: {compiled['skipped'] or 'none'}")
