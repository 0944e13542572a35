"""Synthetic benchmark: runs end to end on CPU (tiny), and its byte accounting for the real 48B
shape (built on the meta device: no memory) matches hand arithmetic from reference §3.7 / §7.2."""
import torch
from click.testing import CliRunner

from engined.commands import bench as synthetic_bench
from engined.weights import synthetic as synthetic_weights
from engined.commands.kimi import bench
from engined.models.kimi_linear import KimiLinearModel
from engined.models.kimi_linear_config import parse_config


def test_bench_command_runs_tiny_on_cpu_and_appends(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("# header\n")
    out = CliRunner().invoke(bench, ["--config", "tiny", "--device", "cpu", "--repeats", "1",
                                     "--record", str(results)])
    assert out.exit_code == 0, out.output
    assert "Kimi-Linear synthetic tiny BF16 on cpu" in out.output and "tok/s" in out.output
    assert "64/64 tokens equal the eager forward's" in out.output   # the timed decoder is checked
    lines = results.read_text().splitlines()
    assert lines[0] == "# header" and "tok/s" in lines[1]


def test_bytes_per_token_of_the_real_shape_matches_reference_arithmetic():
    cfg = parse_config(synthetic_weights.KIMI_LINEAR_48B)
    model = KimiLinearModel(cfg, torch.bfloat16, "meta", synthetic_weights.selective_int4(cfg), torch.bfloat16)
    int4_params = 1_656_225_792 + 754_974_720 + 194_510_848 + 63_700_992     # §7.2 INT4 rows
    bf16_params = 377_487_360 + 34_242_560 + 9_289_728                       # lm_head, low-rank, kv_a
    router = (15_335_424 + 6_656) * 4                                        # router and its bias held in fp32
    small = 983_040 * 2 + 132_864 * 2 + 82_560 * 4 + 2304 * 2                # convs, norms, A_log/dt_bias, 1 row
    weights = int4_params * 9 // 16 + bf16_params * 2 + router + small       # our INT4: 4 bits + fp16 s per 32
    state = 20 * (32 * 128 * 128 * 4 + 3 * 4096 * 3 * 2)                      # S fp32 + 3 conv taps of q/k/v, bf16
    assert model.state_bytes == state
    assert model.kv_bytes_per_token == 7 * 576 * 2
    assert synthetic_bench.bytes_per_token(model, 10) == weights + 2 * state + 10 * 7 * 576 * 2


def test_full_size_int4_weight_bytes_match_reference_counts():
    cfg = parse_config(synthetic_weights.KIMI_LINEAR_48B)
    model = KimiLinearModel(cfg, torch.bfloat16, "meta", synthetic_weights.selective_int4(cfg), torch.bfloat16)
    # §5.4: 48,307,634,176 quantized params (x 0.5625 B in format version 2: codes + one fp16
    # scale per 32, symmetric so no min) + 1,630,260,224 B kept, + 30,684,160 B because the
    # router and its bias are held in fp32.
    assert model.weight_bytes == 48_307_634_176 * 9 // 16 + 1_630_260_224 + (15_335_424 + 6_656) * 2


GPU_IMAGE_CHECK = """
import importlib.abc, sys
class NotOnGpuImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {"cffi", "_cffi_backend", "flask", "gevent"}:
            raise ImportError("not on the GPU image: " + name)
sys.meta_path.insert(0, NotOnGpuImage())
from engined.commands import bench as synthetic_bench
synthetic_bench.main(["--config", "tiny", "--device", "cpu", "--repeats", "1", "--int4"])
"""


def test_bench_imports_and_runs_without_cffi_flask_gevent():
    """The GPU image has no cffi/flask/gevent: model, layers and ops must still import. (On CPU the
    shipped INT4 defaults are C kernels, so this run pins the reference variants.)"""
    import os
    import subprocess
    import sys
    env = {**os.environ,
           "KIMI_KERNELS": "w4a16_gemv=reference,w4a16_gemm=reference,moe_grouped=reference"}
    done = subprocess.run([sys.executable, "-c", GPU_IMAGE_CHECK], env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Kimi-Linear synthetic tiny INT4 on cpu" in done.stdout
