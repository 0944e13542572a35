"""The `kimi-int4.json` manifest of a quantized Kimi-Linear artifact, and its verification.

    {"format": "kimi-packed-int4", "format_version": "2", "plan": "selective", "group_size": 32,
     "tensors": {name: {"dtype": "U8", "shape": [N, K/2], "file": shard}},
     "files": {relative path: {"sha256": hex, "size": bytes}}}

`files` covers every file of the artifact except the manifest itself. Verification re-reads
safetensors headers only (json), never anything that unpickles, and checks each quantized
linear against its recorded layout: group size and scheme in the shard's metadata, scales
[N, K/G], and mins present exactly when the scheme is asymmetric (format version 2).
"""
import json
import pathlib

from engined.weights.hashing import file_sha256
from engined.weights.shards import MANIFEST, CheckpointError, read_header
from engined.ops import int4_format


class VerifyError(CheckpointError):
    """The artifact does not match its manifest."""



def write_manifest(dst: pathlib.Path, plan: str, group_size: int, tensors: dict) -> dict:
    files = {p.relative_to(dst).as_posix(): {"sha256": file_sha256(p), "size": p.stat().st_size}
             for p in sorted(dst.rglob("*")) if p.is_file() and p.name != MANIFEST}
    manifest = {"format": int4_format.FORMAT_NAME, "format_version": int4_format.FORMAT_VERSION,
                "plan": plan, "group_size": group_size, "tensors": tensors, "files": files}
    (dst / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def read_manifest(path: pathlib.Path) -> dict:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise VerifyError(f"{path}: no {MANIFEST} (not a kimi-local INT4 artifact)") from None
    except json.JSONDecodeError as exc:
        raise VerifyError(f"{path}/{MANIFEST} is not JSON ({exc})") from None
    if (manifest.get("format"), manifest.get("format_version")) != (
            int4_format.FORMAT_NAME, int4_format.FORMAT_VERSION):
        raise VerifyError(f"{MANIFEST}: format {manifest.get('format')!r} version "
                          f"{manifest.get('format_version')!r} is not {int4_format.FORMAT_NAME} "
                          f"v{int4_format.FORMAT_VERSION}; re-quantize the source checkpoint "
                          "(`kimi-engine quantize`)")
    if not isinstance(manifest.get("files"), dict) or not isinstance(manifest.get("tensors"), dict):
        raise VerifyError(f"{MANIFEST}: missing 'files' or 'tensors'")
    return manifest


def verify_artifact(path, rehash: bool = True) -> dict:
    """Check files (size, and sha256 unless rehash=False) and every shard header against the
    manifest. Returns a summary; raises VerifyError naming the first mismatch."""
    path = pathlib.Path(path).expanduser()
    manifest = read_manifest(path)
    listed = manifest["files"]
    present = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != MANIFEST}
    extra = sorted(n for n in present - set(listed) if n.endswith((".safetensors", ".json")))
    if extra:
        raise VerifyError(f"files not in the manifest: {', '.join(extra)}")
    for name, entry in listed.items():
        f = path / name
        if not f.is_file():
            raise VerifyError(f"{name}: listed in the manifest but missing")
        if f.stat().st_size != entry["size"]:
            raise VerifyError(f"{name}: size {f.stat().st_size} != manifest {entry['size']}")
        if rehash and file_sha256(f) != entry["sha256"]:
            raise VerifyError(f"{name}: sha256 differs from the manifest (file changed or corrupt)")
    symmetric = _verify_headers(path, manifest)
    tensors = manifest["tensors"]
    return {"files": len(listed), "tensors": len(tensors), "plan": manifest.get("plan"),
            "quantized": sum(n.endswith(".qweight") for n in tensors), "symmetric": symmetric,
            "rehashed": rehash}


def _verify_headers(path: pathlib.Path, manifest: dict) -> int:
    """Headers against the manifest and every quantized linear against its recorded layout;
    returns how many linears are symmetric."""
    by_file: dict[str, dict] = {}
    symmetric = 0
    for name, entry in manifest["tensors"].items():
        by_file.setdefault(entry["file"], {})[name] = (entry["dtype"], tuple(entry["shape"]))
    for fname in sorted(n for n in manifest["files"] if n.endswith(".safetensors")):
        header = read_header(path / fname)
        try:
            int4_format.check_metadata(header.meta, fname)
        except int4_format.FormatError as exc:
            raise VerifyError(str(exc)) from None
        if header.tensors != by_file.pop(fname, {}):
            raise VerifyError(f"{fname}: tensor names, dtypes or shapes differ from the manifest")
        for name in header.tensors:
            if name.endswith(".qweight"):
                symmetric += _verify_layout(fname, header, name.removesuffix(".qweight"))
    if by_file:
        raise VerifyError(f"manifest tensors in unknown files: {', '.join(sorted(by_file))}")
    return symmetric


def _verify_layout(fname: str, header, stem: str) -> bool:
    """One quantized linear: recorded group size and scheme, scales [N, K/G], and mins
    exactly when asymmetric. Returns whether it is symmetric."""
    try:
        lay = int4_format.layout(stem, header.meta)
    except int4_format.FormatError as exc:
        raise VerifyError(f"{fname}: {exc}") from None
    n, half_k = header.tensors[stem + ".qweight"][1]
    want = ("F16", (n, 2 * half_k // lay.group_size))
    scales, mins = header.tensors.get(stem + ".scales"), header.tensors.get(stem + ".mins")
    if (2 * half_k) % lay.group_size or scales != want:
        raise VerifyError(f"{fname}: {stem}.scales is {scales}; group size {lay.group_size} "
                          f"needs {want}")
    if (mins is None) != lay.symmetric:
        raise VerifyError(f"{fname}: {stem} is recorded {lay.scheme} but "
                          f"{'lacks' if mins is None else 'has'} {stem}.mins")
    if mins is not None and mins != want:
        raise VerifyError(f"{fname}: {stem}.mins is {mins}; group size {lay.group_size} "
                          f"needs {want}")
    return lay.symmetric
