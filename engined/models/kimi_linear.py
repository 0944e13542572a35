"""Kimi-Linear forward: embedding -> [norm, KDA|MLA, norm, dense|MoE] x L -> norm -> lm_head.
This module only wires layers (engined/layers/{kda,mla,moe,mlp,rmsnorm,linear}.py); the checkpoint
names live in engined/weights/kimi_checkpoint.py's table. Activations run in `dtype`; the KDA state,
router, softmax and norms compute in fp32.
"""
import contextlib
import logging

import torch

from engined.layers.expert_cache import ExpertCache
from engined.layers.linear import Linear
from engined.layers.moe import ExpertBank, MoE, scope
from engined.layers.moe_offload import HostBuffers, HostExperts, OffloadCounters, page_locked
from engined.layers.rmsnorm import RMSNorm
from engined.models.kimi_cache import DecodeRows, KimiCache, StatePool
from engined.models.kimi_layer import DecoderLayer
from engined.models.kimi_graph_step import KimiGraphStep
from engined.models.kimi_piecewise import KimiPiecewiseStep
from engined.models.kimi_rows import STEP_ROWS, sequence_runs, step_rows
from engined.models.latent_pool import LatentPool, num_blocks_for
from engined.models.kimi_linear_config import KimiLinearConfig
from engined.models.protocol import check_span
from engined.ops import registry, rowwise
from engined.ops.w4a16_gemv.cpu_c import torch_single_threaded

log = logging.getLogger(__name__)


def members(obj):
    """Every value held by `obj` and the engined objects and lists under it, each object once
    (host expert buffers and the expert cache are working memory, not weights: not entered)."""
    seen = set()

    def walk(o):
        for v in (o if isinstance(o, list) else vars(o).values()):
            if id(v) in seen:
                continue
            seen.add(id(v))
            yield v
            if isinstance(v, list) or (type(v).__module__.startswith("engined.")
                                       and not isinstance(v, (HostExperts, ExpertCache))):
                yield from walk(v)
    return walk(obj)


def weight_tensors(obj) -> list[torch.Tensor]:
    """Every weight tensor under `obj`, each once (a view, such as q_proj's rows of the stacked
    q/k/v, is its base's)."""
    return [v for v in members(obj) if isinstance(v, torch.Tensor) and v._base is None]


def int4_parts(obj) -> list:
    """Every INT4 Linear and ExpertBank under `obj`, each once."""
    return [v for v in members(obj) if isinstance(v, (Linear, ExpertBank)) and v.group_size]


class KimiLinearModel:
    decode_gemv = ""  # "w4a16_tiles" once its INT4 linears are in tiles (kimi_tiles.py)
    def __init__(self, config: KimiLinearConfig, dtype=torch.float32, device="cpu",
                 int4: dict[str, int] | None = None, weight_dtype: torch.dtype | None = None,
                 offload: frozenset[int] = frozenset(), cache_slots: int = 0):
        """`dtype`: activations and caches; `weight_dtype` (default `dtype`): dense weights.
        offload: MoE layers whose routed experts live in RAM and run on the CPU threads
        (layers/moe_offload.py); their activity is counted in `offload_counters`.
        cache_slots: experts the device caches for those layers (layers/expert_cache.py).
        Allocates every weight empty on `device` (a loader fills them through the table).
        int4: model path -> group size for packed-INT4 projections, e.g.
        {'layers.1.self_attn.q_proj': 32, 'layers.1.block_sparse_moe.w1': 32, 'lm_head': 32}."""
        int4, wd = int4 or {}, weight_dtype or dtype
        c = self.config = config
        self.dtype, self.device = dtype, torch.device(device)
        self.embed_tokens = torch.empty(c.vocab_size, c.hidden_size, dtype=wd, device=device)
        hosts = self._host_experts(c, int4, offload)
        self.layers = [DecoderLayer(c, i, wd, device, scope(int4, f"layers.{i}"), hosts.get(i))
                       for i in range(c.num_hidden_layers)]
        self.expert_cache = self._expert_cache(cache_slots)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, wd, device)
        self.lm_head = Linear(c.vocab_size, c.hidden_size, wd, device, int4.get("lm_head"))
        if c.tie_word_embeddings and not self.lm_head.is_int4:
            self.lm_head.weight = self.embed_tokens              # one tensor, filled once
        latent = (c.kv_lora_rank + c.qk_rope_head_dim) * dtype.itemsize
        self.kv_bytes_per_token = len(c.mla_layers) * latent
        # a prefill chunk's transient per token of context: one MLA layer's at a time
        self.prefill_bytes_per_token = max((layer.self_attn.prefill_width for layer in self.layers
                                            if layer.is_mla), default=0) * dtype.itemsize
        self.weight_bytes = sum(t.nbytes for t in self.tensors())
        self.state_pool = StatePool({i: layer.self_attn for i, layer in enumerate(self.layers)
                                     if not layer.is_mla}, dtype, self.device)
        self.state_bytes = self.state_pool.slot_bytes
        self._scratch: KimiCache | None = None
        self.latent_pool = LatentPool({i: layer.self_attn.latent_width for i, layer in enumerate(self.layers)
                                       if layer.is_mla}, dtype, self.device)

    @property
    def verifies_drafts(self) -> bool:
        """On the CPU, when each decode op runs a row-exact variant (ops/rowwise.py): a row is
        then bit for bit a lone step. On a GPU the torch products of MLA are batched (cuBLAS),
        and a verify step would run outside the captured graphs."""
        return self.device.type == "cpu" and rowwise.rows_exact("cpu")

    def _host_experts(self, c: KimiLinearConfig, int4, offload) -> dict[int, HostExperts]:
        """Layer -> the hybrid step of its routed experts, for the layers in `offload`."""
        self.offload_counters = OffloadCounters() if offload else None
        self.offloaded = tuple(sorted(offload))     # MoE layers whose routed experts are in RAM
        not_moe = sorted(i for i in offload if not c.is_moe(i))
        if not_moe:
            raise ValueError(f"layers {not_moe} have no routed experts to keep in RAM")
        dense = [i for i in offload if f"layers.{i}.block_sparse_moe.w1" not in int4]
        if dense:
            raise ValueError("routed experts in RAM need the INT4 artifact (kimi-engine "
                             "quantize); this checkpoint's experts are not INT4")
        if not offload:
            return {}
        buffers = HostBuffers(c.hidden_size, c.num_experts_per_token, self.device)
        return {i: HostExperts(buffers, self.offload_counters, i) for i in offload}

    def _expert_cache(self, slots: int) -> ExpertCache | None:
        """One pool of `slots` expert slots on the device for every offloaded layer."""
        if not slots:
            return None
        if not self.offloaded:
            raise ValueError("an expert cache serves MoE layers whose experts are in RAM; none are")
        moes = [self.layers[i].block_sparse_moe for i in self.offloaded]
        cache = ExpertCache(slots, (moes[0].w1.packed, moes[0].w3.packed, moes[0].w2.packed),
                            self.device)
        for moe in moes:
            moe.host_experts.cache = cache
        self.offload_counters.cache = cache.counters
        return cache

    def tensors(self) -> list[torch.Tensor]:
        return weight_tensors(self)

    def select_experts(self, op: str, required: bool = True):
        """The op of the INT4 routed experts the CPU runs (--device cpu, or in RAM beside a
        GPU): moe_grouped (W4A16, the default) or moe_grouped_w4a8 (--moe-w4a8). Once loaded,
        so that the banks in RAM take the op's layout (MoE.select_experts). required: a
        checkpoint without INT4 experts is refused (else nothing to do)."""
        moes = [layer.ffn for layer in self.layers
                if isinstance(layer.ffn, MoE) and layer.ffn.w1.group_size]
        if not moes and not required:
            return
        if not moes:
            raise ValueError(f"{op} runs INT4 routed experts; this checkpoint's are not INT4 "
                             "(kimi-engine quantize)")
        for moe in moes:
            moe.select_experts(op)

    def to_gpu_order_(self):
        """Once the weights are loaded: every INT4 linear and expert bank on the model's device
        gets its codes in the GPU kernels' order, in place (int4_format.gpu_order); experts kept
        in RAM for the C helper keep the disk's order. A view (q_proj, rows of qkv) is marked,
        its base permuted. By the device's kind: a CUDA tensor says cuda:0, the model was
        given "cuda", and torch.device("cuda:0") != torch.device("cuda")."""
        for part in int4_parts(self):
            if part.qweight.device.type != self.device.type:
                continue
            if isinstance(part, Linear):
                part.to_gpu_order_(permute=part.qweight._base is None)
            else:
                part.to_gpu_order_()

    def settle_on_device_(self):
        """Once the weights are loaded (the checkpoint loader, synthetic.build): on CUDA, the
        codes in the GPU kernels' order and the offloaded banks page-locked."""
        if self.device.type == "cuda":
            self.to_gpu_order_()
            self.page_lock_offloaded_()

    def page_lock_offloaded_(self):
        """With an expert cache, on CUDA once loaded: the offloaded layers' banks page-locked
        in place (cudaHostRegister until their memory is freed), so that the cache's uploads
        are copies its side stream runs while the decode thread goes on. From pageable memory
        a copy first stages through a pinned buffer on the calling thread: about 0.3 ms per
        48B expert, on the decode step's path. A registration the driver refuses leaves the
        rest pageable, with a warning: slower uploads, the same results."""
        if self.expert_cache is None:
            return
        for i in self.offloaded:
            moe = self.layers[i].moe
            for t in (t for bank in (moe.w1, moe.w3, moe.w2)
                      for t in (bank.packed.qweight, bank.packed.scales, bank.packed.mins)
                      if t is not None):
                try:
                    page_locked(t)
                except RuntimeError as exc:
                    log.warning("routed experts in RAM stay pageable: %s", exc)
                    return

    def new_cache(self, max_tokens: int) -> KimiCache:
        if not 0 < max_tokens <= self.config.context_length:
            raise ValueError(f"cache of {max_tokens} tokens: must be 1..{self.config.context_length}")
        return KimiCache(self.state_pool, self.latent_pool, max_tokens)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, cache: KimiCache, start: int,
                last_only: bool = True) -> torch.Tensor:
        """tokens: [T] int64 at positions start..start+T-1 -> logits fp32 [1, V] or [T, V]."""
        t = check_span(tokens, cache, start)
        cache.resume(start)
        h = self.embed_tokens[tokens.to(self.device)].to(self.dtype)  # [T, D]
        for i, layer in enumerate(self.layers):
            h = layer(h, cache, i, start)
        cache.num_tokens = start + t
        if last_only:
            h = h[-1:]
        return self.lm_head(self.norm(h)).float()                # [T or 1, V]

    @torch.inference_mode()
    def decode_batch(self, tokens: torch.Tensor, caches: list[KimiCache],
                     positions: list[int]) -> torch.Tensor:
        """One token for each of B rows -> logits fp32 [B, V]. tokens: [B] int64; token b sits
        at positions[b] of caches[b]. A sequence's rows are consecutive, at consecutive
        positions from one its state can continue at (KimiCache.resume): one row, or its input
        token and the drafts a speculative step verifies, row j's state in its own slot.
        Builds the rows' device tensors and runs decode_rows, on the CPU STEP_ROWS rows at a
        time (the GEMV's rows, so every row's result is the one a lone step gives)."""
        runs = sequence_runs(caches, positions)
        for cache, first, count in runs:
            if cache.pool is not self.state_pool:
                raise ValueError("a cache of another model's state pool")
            if positions[first] < 0 or positions[first] + count > cache.max_tokens:
                raise ValueError(f"positions {positions[first]}..{positions[first] + count - 1} "
                                 f"do not fit a cache of {cache.max_tokens} tokens")
            cache.resume(positions[first])
        row_of = [positions[b] - positions[first] for _, first, count in runs
                  for b in range(first, first + count)]               # each row's j in its run
        self.state_pool.reserve(self.state_pool.num_used + sum(   # draft slots: one growth
            max(0, count - len(cache.slots)) for cache, _, count in runs))
        on_cpu = self.device.type == "cpu"
        part = STEP_ROWS if on_cpu else len(caches)   # a GPU's >8 rows run its GEMM, once
        with torch_single_threaded() if on_cpu else contextlib.nullcontext():
            logits = torch.cat([self._decode_part(tokens[s:s + part], caches[s:s + part],
                                                  positions[s:s + part], row_of[s:s + part])
                                for s in range(0, len(caches), part)])
        for cache, first, count in runs:
            cache.ran(positions[first], count)
        return logits

    def _decode_part(self, tokens, caches, positions, row_of) -> torch.Tensor:
        """decode_rows on some of a step's rows (kimi_rows.step_rows: their tensors)."""
        rows = step_rows(caches, positions, row_of, self.device)
        return self.decode_rows(tokens.to(self.device), rows)

    @torch.inference_mode()
    def decode_rows(self, tokens: torch.Tensor, rows: DecodeRows) -> torch.Tensor:
        """One token for each of B rows, tensors only (no host sync, no value read back), so a
        CUDA graph can capture it. tokens: [B] int64 on the device -> logits fp32 [B, V]. Every
        projection, the short conv and KDA step (on the rows' state slots, in place), the MLA
        attention (paged_mla_decode over each row's own blocks), the routed experts
        (moe_grouped) and the LM head run once for all rows."""
        h, rows = self.decode_embed(tokens, rows)
        delta = self.decode_layers(h, None, rows, 0, len(self.layers))
        return self.decode_head(h, delta)

    def decode_embed(self, tokens: torch.Tensor, rows: DecodeRows) -> tuple[torch.Tensor, DecodeRows]:
        """tokens: [B] -> the residual stream h [B, D] (a new tensor) and rows with lengths,
        the keys each MLA row sees."""
        return self.embed_tokens[tokens].to(self.dtype), rows._replace(lengths=rows.positions + 1)

    def decode_layers(self, h: torch.Tensor, delta: torch.Tensor | None, rows: DecodeRows,
                      first: int, end: int) -> torch.Tensor | None:
        """Layers first..end-1 of the decode step on h (in place) -> the last one's FFN output."""
        pools = (self.state_pool, self.latent_pool)
        for i in range(first, end):
            delta = self.layers[i].decode_batch(h, delta, i, pools, rows)
        return delta

    def decode_head(self, h: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """The last layer's output added, the final norm and the LM head -> logits fp32 [B, V]."""
        x = registry.resolve("add_rmsnorm", h.device.type).fn(h, delta, self.norm.weight, self.norm.eps)
        return self.lm_head(x).float()

    def graph_step(self, rows: int, max_context: int):
        """The decode step of `rows` rows for a CUDA graph (models/kimi_graph_step.py), the
        pools reserved first: a state slot per row plus scratch, and the blocks of max_context
        tokens (the scheduler's budget across sequences) plus a rounding block per row. With
        offloaded experts the step is piecewise (models/kimi_piecewise.py): a graph segment
        before each offloaded MoE layer's CPU part and one after the last."""
        max_blocks = num_blocks_for(max_context)
        self.state_pool.reserve(self.state_pool.num_used + rows + 1)
        self.latent_pool.reserve(self.latent_pool.num_used + max_blocks + rows + 1)
        if self.offloaded:
            return KimiPiecewiseStep(self, rows, max_blocks)
        return KimiGraphStep(self, rows, max_blocks)

    def scratch_cache(self) -> KimiCache:
        """The sequence padded decode rows read and write (one slot, one block), made once."""
        if self._scratch is None:
            self._scratch = self.new_cache(1)
        return self._scratch

    def pool_addresses(self) -> tuple[int, ...]:
        """Where every pool tensor lives: a captured graph is valid while this is unchanged."""
        tensors = [*self.state_pool.conv.values(), *self.state_pool.S.values(),
                   *self.latent_pool.latents.values()]
        return tuple(t.data_ptr() for t in tensors)
