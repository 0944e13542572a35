"""bench/ scripts loaded by path, never by putting bench/ on sys.path: a module there can
shadow a package that a library imports (bench/kernels.py, since renamed int4_kernels.py, hid
the `kernels` package transformers imports), and every later test in the session would see it."""
import importlib.util
import pathlib
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"


def load(name: str):
    """bench/NAME.py as the module `bench_NAME`, loaded once."""
    key = f"bench_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]
