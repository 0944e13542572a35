"""A stand-in H200 for Triton on a machine with no GPU: every kernel launch compiles for sm_90
(Triton's passes, then the wheel's ptxas, to a cubin) and none runs. With it, the CUDA code path
of a model on the meta device launches every kernel it would on the GPU, at the real shapes and
specializations, and fla-core sees the Hopper it would see there.

Process-wide and for good (torch.cuda's device queries are replaced): a child process's tool,
as tests/support/gpu_step_compile.py uses it.
"""
import contextlib
import importlib
import itertools
import os
import pkgutil
import time
from dataclasses import dataclass

import torch

MAX_SHARED = 232448  # bytes of shared memory a block may opt into on sm_90 (H100, H200)
SMS = 132


@dataclass(frozen=True)
class Compiled:
    kernel: str
    seconds: float
    shared: int      # bytes of shared memory the compiled kernel asks at launch
    num_warps: int
    tuning: int      # 0: a plain launch; else the autotuner call (from 1 in each `compiling`) it is a
                     # config of: a config that does not fit is skipped there, one must fit


class _Utils:
    def get_device_properties(self, device):
        return {"max_shared_mem": MAX_SHARED, "multiprocessor_count": SMS, "max_num_regs": 65536,
                "warpSize": 32, "sm_clock_rate": 1980000, "mem_clock_rate": 2619000,
                "mem_bus_width": 6144}


class Driver:
    """Triton's view of the device: CUDA, sm_90, device 0, stream 0."""

    utils = _Utils()

    def is_active(self):
        return True

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_device_interface(self):
        return torch.cuda


def _props(*args, **kwargs):
    return type("Props", (), {"name": "NVIDIA H200", "multi_processor_count": SMS,
                              "shared_memory_per_block_optin": MAX_SHARED,
                              "shared_memory_per_block": 49152})()


def install():
    """The stand-in becomes Triton's driver and torch's CUDA device queries; then every Triton
    kernel module (ours, and fla's chunk_kda, which reads the device kind when imported) is
    imported in compiled mode. From then on TRITON_INTERPRET=1 is set for the launchers' own
    guards only (they let CPU and meta tensors through under it); the kernels stay compiled."""
    from triton.runtime import driver
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("the sm_90 stand-in needs compiled kernels: unset TRITON_INTERPRET")
    driver.set_active(Driver())
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_name = lambda *a, **k: "NVIDIA H200"
    torch.cuda.get_device_properties = _props
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    import engined.ops as ops
    for module in pkgutil.walk_packages(ops.__path__, "engined.ops."):
        if module.name.rsplit(".", 1)[-1].startswith("triton"):
            importlib.import_module(module.name)
    importlib.import_module("fla.ops.kda")
    os.environ["TRITON_INTERPRET"] = "1"


@contextlib.contextmanager
def compiling(record: list[Compiled], skipped: list[str]):
    """Each launch compiles (or finds its cache) and is appended to `record`; nothing runs, so
    outputs keep what they held. An autotuner with several configs compiles every one it keeps
    after pruning, as the GPU's does before timing them, and like it skips a config that fails
    to compile for lack of resources (named in `skipped`); one with a single config launches
    it untimed, as a plain launch."""
    from triton.compiler.errors import CompileTimeAssertionFailure
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.errors import OutOfResources, PTXASError
    from triton.runtime.jit import JITFunction

    jit_run, tuner_run = JITFunction.run, Autotuner.run
    calls = itertools.count(1)
    tuning = [0]  # the autotuner call under way, 0 for none

    def run(self, *args, grid, warmup, **kwargs):
        begin = time.perf_counter()
        kernel = jit_run(self, *args, grid=grid, warmup=True, **kwargs)
        record.append(Compiled(self.fn.__name__, time.perf_counter() - begin,
                               kernel.metadata.shared, kernel.metadata.num_warps, tuning[-1]))
        return kernel

    def tune(self, *args, **kwargs):
        self.nargs = dict(zip(self.arg_names, args))
        configs = self.prune_configs(kwargs) if len(self.configs) > 1 else self.configs
        tuning.append(next(calls) if len(configs) > 1 else 0)
        try:
            for config in configs:
                if config.pre_hook is not None:
                    config.pre_hook({**self.nargs, **kwargs, **config.all_kwargs()})
                try:
                    self.fn.run(*args, **kwargs, **config.all_kwargs())
                except (OutOfResources, CompileTimeAssertionFailure, PTXASError) as e:
                    if not tuning[-1]:
                        raise
                    skipped.append(f"{self.base_fn.__name__} {config}: {e}")
        finally:
            tuning.pop()
        self.best_config, self.nargs = configs[0], None

    JITFunction.run, Autotuner.run = run, tune
    try:
        yield record
    finally:
        JITFunction.run, Autotuner.run = jit_run, tuner_run
