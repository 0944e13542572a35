"""`kimi-engine quantize`: a BF16 Kimi-Linear checkpoint -> our packed-INT4 artifact.

Plans (reference §5.2): `selective` quantizes routed + shared experts, KDA q/k/v/o, MLA
q/kv_b/o and the dense layer-0 MLP; router, f/g/b low-rank projections, kv_a, norms, conv,
A_log/dt_bias, embeddings and lm_head stay as they are. `all` also quantizes the low-rank
projections, kv_a and lm_head. `none` copies everything (a verified BF16 artifact). Every
tensor must match a POLICY row, or the run fails before writing anything (fail closed, §8.26).
Symmetric codes per engined/ops/int4_format.py (q = c + 8, scales only, no mins: format version
2), each linear's scheme recorded in the shard metadata. One shard in RAM at a time.
"""
import json
import pathlib
import shutil

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from engined.weights import manifest as kimi_manifest
from engined.weights.kimi_checkpoint import open_checkpoint
from engined.weights.shards import INDEX, MANIFEST, ST_DTYPES, CheckpointError, Header, read_header
from engined.weights.quant_policy import PLANS, QuantizeError, policy
from engined.ops import int4_format

COPY_SKIP = (".safetensors", INDEX, MANIFEST)


def plan_tensors(headers, plan: str, group_size: int) -> dict[str, str]:
    """name -> 'int4' | 'keep' for every source tensor, checked before any work starts."""
    decisions = {}
    for header in headers.values():
        for name, (dtype, shape) in header.tensors.items():
            d = decisions[name] = policy(name, plan)
            if d == "int4" and (len(shape) != 2 or shape[1] % group_size):
                raise QuantizeError(f"{name}: shape {list(shape)} cannot take INT4 groups of {group_size}")
    return decisions


def int4_bytes(n: int, k: int, group_size: int) -> int:
    """Bytes of one symmetric INT4 linear [N, K]: codes (K/2 per row) and fp16 scales."""
    return n * (k // 2) + 2 * n * (k // group_size)


def planned_bytes(headers, plan: str, group_size: int) -> int:
    """Tensor bytes of the artifact `plan` would write, from the source headers alone."""
    decisions = plan_tensors(headers, plan, group_size)
    total = 0
    for header in headers.values():
        for name, (dtype, shape) in header.tensors.items():
            if decisions[name] == "int4":
                total += int4_bytes(shape[0], shape[1], group_size)
            else:
                total += ST_DTYPES[dtype].itemsize * int(torch.Size(shape).numel())
    return total


def _quantize_shard(src_file, decisions, group_size, bar) -> tuple[dict, dict]:
    out, layouts = {}, {}
    with safe_open(str(src_file), framework="pt", device="cpu") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            if decisions[name] == "int4":
                stem = name.removesuffix(".weight")
                packed = int4_format.quantize_sym(t, group_size)
                out.update(int4_format.to_state_dict(stem, packed))
                layouts[stem] = packed.layout
            else:
                out[name] = t.contiguous()
            if bar is not None:
                bar.update(1)
    return out, layouts


def check_settings(plan: str, group_size: int):
    if plan not in PLANS:
        raise QuantizeError(f"plan {plan!r} is not one of {', '.join(PLANS)}")
    if group_size <= 0 or group_size % 2:
        raise QuantizeError(f"group size {group_size} must be a positive even number")


class ArtifactWriter:
    """An artifact written shard by shard into DST.partial, renamed to DST when sealed: `pull`
    quantizes each shard as it arrives, `quantize` walks a local checkpoint."""

    def __init__(self, dst: pathlib.Path, plan: str, group_size: int, decisions: dict[str, str],
                 resume: bool = False):
        self.dst, self.plan, self.group_size, self.decisions = dst, plan, group_size, decisions
        self.partial = dst.with_name(dst.name + ".partial")
        if not resume:
            shutil.rmtree(self.partial, ignore_errors=True)
        self.partial.mkdir(parents=True, exist_ok=True)
        self.tensors: dict[str, dict] = {}
        self.shards: list[str] = []

    def copy_support(self, src: pathlib.Path):
        """Every non-weight file of the source directory (config, tokenizer, remote code)."""
        for f in src.iterdir():
            if f.is_file() and not f.name.endswith(COPY_SKIP):
                shutil.copy2(f, self.partial / f.name)

    def add_shard(self, shard: pathlib.Path, bar) -> pathlib.Path:
        """Quantize one source shard into the artifact; returns the shard written, its header
        re-read and checked against what was written."""
        out, layouts = _quantize_shard(shard, self.decisions, self.group_size, bar)
        written = self.partial / shard.name
        save_file(out, str(written), metadata=int4_format.metadata(layouts))
        want = {n: (_st_dtype(t.dtype), tuple(t.shape)) for n, t in out.items()}
        if read_header(written).tensors != want:
            raise QuantizeError(f"{written.name}: the written header differs from its tensors")
        for name, (dtype, shape) in want.items():
            self.tensors[name] = {"dtype": dtype, "shape": list(shape), "file": shard.name}
        self.shards.append(shard.name)
        return written

    def adopt(self, name: str, source: Header) -> bool:
        """Take the shard `name` an interrupted run already wrote, when it is whole and holds
        exactly what the source header `source` plans; False means write it anew."""
        written = self.partial / name
        want, stems = set(), []
        for tensor in source.tensors:
            stem = tensor.removesuffix(".weight")
            int4 = self.decisions[tensor] == "int4"
            want |= {stem + ".qweight", stem + ".scales"} if int4 else {tensor}
            stems += [stem] if int4 else []
        try:
            header = read_header(written)
            layouts = {int4_format.layout(stem, header.meta) for stem in stems}
        except (OSError, CheckpointError, int4_format.FormatError):
            return False
        end = max((span[1] for span in header.spans.values()), default=0)
        same_layout = layouts <= {int4_format.Int4Layout(self.group_size, True)}
        if set(header.tensors) != want or end != written.stat().st_size or not same_layout:
            return False
        for tensor, (dtype, shape) in header.tensors.items():
            self.tensors[tensor] = {"dtype": dtype, "shape": list(shape), "file": name}
        self.shards.append(name)
        return True

    def seal(self) -> dict:
        """Write the index and the manifest, then move the artifact into place."""
        total = sum((self.partial / s).stat().st_size for s in self.shards)
        weight_map = {name: entry["file"] for name, entry in self.tensors.items()}
        index = {"metadata": {"total_size": total, "quantization": "kimi-packed-int4",
                              "plan": self.plan, "group_size": self.group_size},
                 "weight_map": weight_map}
        (self.partial / INDEX).write_text(json.dumps(index, indent=1))
        manifest = kimi_manifest.write_manifest(self.partial, self.plan, self.group_size,
                                                self.tensors)
        self.partial.rename(self.dst)
        return manifest


def quantize_checkpoint(src, dst, plan: str = "selective", group_size: int = 32,
                        progress: bool = True) -> dict:
    """Write the artifact into `dst` (must not exist); returns the manifest."""
    check_settings(plan, group_size)
    src, dst = pathlib.Path(src).expanduser(), pathlib.Path(dst).expanduser()
    ckpt = open_checkpoint(src)
    if ckpt.is_int4:
        raise QuantizeError(f"{src} is already a kimi-local INT4 artifact")
    decisions = plan_tensors(ckpt.headers, plan, group_size)
    if dst.exists():
        raise QuantizeError(f"{dst} already exists; choose a new directory")
    writer = ArtifactWriter(dst, plan, group_size, decisions)
    writer.copy_support(src)
    with tqdm(total=len(decisions), desc=f"quantize ({plan})", unit="tensor", disable=not progress) as bar:
        for shard in ckpt.shards:
            writer.add_shard(shard, bar)
    return writer.seal()


def _st_dtype(dtype: torch.dtype) -> str:
    return {torch.uint8: "U8", torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32"}[dtype]
