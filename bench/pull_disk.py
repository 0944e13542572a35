"""Peak disk and RAM of `kimi-engine pull`: measured on the tiny 3-shard Kimi-Linear served by
the test hub (tests/support/hub_server.py, the real huggingface_hub pointed at it), and planned
for Kimi-Linear-48B-A3B from its shard headers, as quantize's plan does.

    .venv/bin/python bench/pull_disk.py            # prints the table and records it

The baseline is what the four manual steps needed: the BF16 download plus the artifact on
disk at once. The 48B headers are the reference's shapes (tests/weights/test_kimi_loader.py's
kimi_48b_config), cut into shards of at most 5 GB in checkpoint order, as save_pretrained's
max_shard_size does; the real repository's shard boundaries may differ by a tensor or two."""
import json
import math
import os
import pathlib
import resource
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import record  # noqa: E402
from engined.config import format_size  # noqa: E402
from engined.weights.quantize import planned_bytes  # noqa: E402
from engined.weights.shards import Header  # noqa: E402
from tests.support import kimi_tiny  # noqa: E402
from tests.support.hub_server import HubServer  # noqa: E402
from tests.weights.test_kimi_loader import kimi_48b_config  # noqa: E402

REPO = "bench/Kimi-Tiny"
SHARD_LIMIT = 5 * 10**9


def measured_tiny(tmp: pathlib.Path) -> dict:
    src = kimi_tiny.write_tiny_checkpoint(tmp / "bf16", num_shards=3)
    shards = sorted(src.glob("*.safetensors"))
    with HubServer() as hub:
        hub.push_dir(REPO, src)
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp / "hf"),
               "XDG_CACHE_HOME": str(tmp / "cache"), "PYTHONPATH": str(ROOT)}
        env.pop("CACHE_DIRECTORY", None)
        out = subprocess.run([sys.executable, "-m", "tests.support.pull_probe", REPO], env=env,
                             cwd=ROOT, text=True, capture_output=True, check=True)
    probe = json.loads(out.stdout.splitlines()[-1])
    artifact = next(p for p in (tmp / "cache" / "kimi" / "models").glob("*/*") if p.is_dir()
                    and len(p.name) == 40)
    return {"peak_disk": probe["peak"], "peak_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
            "artifact": sum(p.stat().st_size for p in artifact.iterdir()),
            "largest_shard": max(s.stat().st_size for s in shards),
            "bf16": sum(s.stat().st_size for s in shards)}


def planned_48b() -> dict:
    shapes = kimi_tiny.tensor_shapes(kimi_48b_config())
    shards, current, size = [], {}, 0
    for name, (shape, dtype) in shapes.items():
        nbytes = (4 if dtype == "F32" else 2) * math.prod(shape)
        if current and size + nbytes > SHARD_LIMIT:
            shards.append((current, size))
            current, size = {}, 0
        current[name], size = (dtype, tuple(shape)), size + nbytes
    shards.append((current, size))
    headers = {f"shard-{k}": Header({}, tensors, {}) for k, (tensors, _) in enumerate(shards)}
    artifact = planned_bytes(headers, "selective", 32)
    return {"shards": len(shards), "artifact": artifact, "largest_shard": max(s for _, s in shards),
            "bf16": sum(s for _, s in shards)}


def main():
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tiny = measured_tiny(pathlib.Path(tmp))
    big = planned_48b()
    peak_48b = big["artifact"] + big["largest_shard"]
    lines = [
        "| | BF16 source | INT4 artifact | peak disk, pull | peak disk, download then quantize | peak RAM, pull |",
        "|---|---:|---:|---:|---:|---:|",
        f"| tiny Kimi-Linear, 3 shards (measured) | {format_size(tiny['bf16'])} | "
        f"{format_size(tiny['artifact'])} | {format_size(tiny['peak_disk'])} (artifact + largest "
        f"shard: {format_size(tiny['artifact'] + tiny['largest_shard'])}) | "
        f"{format_size(tiny['bf16'] + tiny['artifact'])} | {format_size(tiny['peak_rss'])} (the "
        "whole process: Python, torch, huggingface_hub) |",
        f"| Kimi-Linear-48B-A3B, {big['shards']} shards of <= 5 GB (planned from headers) | "
        f"{big['bf16'] / 1e9:.1f} GB | {big['artifact'] / 1e9:.1f} GB | {peak_48b / 1e9:.1f} GB | "
        f"{(big['bf16'] + big['artifact']) / 1e9:.1f} GB | one shard's tensors: at most "
        f"{big['largest_shard'] / 1e9:.1f} GB + its INT4 output |",
        "",
        "Peak disk of the pull is sampled at every phase the pull logs (after each download, "
        "after each quantize, before the BF16 shard is deleted), under the engine cache.",
    ]
    print("\n".join(lines))
    if args.no_record:
        return
    record("pull_disk", {"tiny": tiny, "kimi_linear_48b": {**big, "peak_disk": peak_48b}},
           "kimi-engine pull: peak disk and RAM (tiny measured, 48B planned)",
           "python bench/pull_disk.py", lines)


if __name__ == "__main__":
    main()
