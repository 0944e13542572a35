"""What the GPU machines' image lacks: every top-level module installed here whose
distribution is neither on the image (bench/gpu_image.txt) nor carried there by `make
gpu-carry` (the Makefile's GPU_PINS). gpu_run.sh's dry run hides them (image_site/)."""
import importlib.metadata
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
SITE = pathlib.Path(__file__).resolve().parent / "image_site"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_distributions() -> set[str]:
    lines = (ROOT / "bench" / "gpu_image.txt").read_text().splitlines()
    return {_norm(line) for line in lines if line.strip() and not line.startswith("#")}


def carried_distributions() -> set[str]:
    """The names pinned in the Makefile's GPU_PINS ("cffi==" + ..., "fla-core==" + ...)."""
    makefile = (ROOT / "Makefile").read_text()
    pins = makefile[makefile.index("GPU_PINS ="):makefile.index("gpu-carry:")]
    return {_norm(name) for name in re.findall(r'"([A-Za-z0-9_.-]+)=="', pins)}


def hidden_modules() -> set[str]:
    """Top-level modules of distributions the image neither has nor gets carried."""
    present = image_distributions() | carried_distributions()
    hidden = set()
    for module, dists in importlib.metadata.packages_distributions().items():
        if module.isidentifier() and not any(_norm(d) in present for d in dists):
            hidden.add(module)
    return hidden - {"engined", "proxy", "kimi_common"}


def env(base: dict, log=None) -> dict:
    """base with the image's missing modules hidden in every Python process it starts; each
    such process appends its command line to `log` when given."""
    path = base.get("PYTHONPATH")
    return {**base, "KIMI_HIDDEN_MODULES": ",".join(sorted(hidden_modules())),
            "PYTHONPATH": str(SITE) + (":" + path if path else ""),
            **({"KIMI_HIDDEN_LOG": str(log)} if log else {})}
