import torch
import torch.nn.functional as F

from engined import helper
from engined.ops.w4a16_gemv import cpu_c

Q8_GROUP = 32


def dequantize_q8_0(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype,
                    rows_per_chunk: int = 4096) -> torch.Tensor:
    """q: [N, K] int8, scales: [N, K/32] fp16 -> [N, K] `dtype`, w = d * q computed in fp32
    (as GGUF does), converted chunk by chunk so no full fp32 copy is ever held."""
    n, k = q.shape
    out = torch.empty(n, k, dtype=dtype)
    for begin in range(0, n, rows_per_chunk):
        rows = slice(begin, begin + rows_per_chunk)
        block = q[rows].float().view(-1, k // Q8_GROUP, Q8_GROUP) * scales[rows].float()[..., None]
        out[rows] = block.view(-1, k).to(dtype)
    return out


class TiedEmbedding:
    """Token embedding whose matrix is also the LM head. weight: [V, D] in `dtype`.

    fp16 on the CPU (the default) runs the head as one C GEMV (gemv_f16) that accumulates in
    fp32: half the bytes of an fp32 head, full-precision logits, and each row's logits
    independent of the batch. Otherwise a 16-bit weight runs as one 16-bit matmul whose output
    is rounded to 16 bits: near the top of the distribution that rounding (2^-6 at |logit| ~ 20
    in fp16) can tie or swap close candidates, so the REFINE largest logits of each row are
    recomputed in fp32 from the same weight rows. engined/ops/README.md records the
    measurements behind this choice."""

    REFINE = 64

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        # tokens: [T] -> [T, D] fp32
        return self.weight[tokens].float()

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D] fp32 -> [T, V] fp32
        if self.is_c_head:
            return self._c_logits(x)
        if self.weight.dtype == torch.float32:
            return F.linear(x, self.weight)
        logits = F.linear(x.to(self.weight.dtype), self.weight).float()  # [T, V]
        top = logits.topk(min(self.REFINE, logits.shape[-1]), dim=-1).indices  # [T, R]
        rows = self.weight[top].float()  # [T, R, D]
        exact = torch.einsum("trd,td->tr", rows, x)  # t: token, r: candidate, d: hidden
        return logits.scatter_(-1, top, exact)

    @property
    def is_c_head(self) -> bool:
        """fp16 on the CPU with the C helper: one pass of fp32-accumulated dot products, each
        row's logits independent of the rows batched with it (no 16-bit rounding to refine)."""
        w = self.weight
        return (w.dtype == torch.float16 and w.device.type == "cpu" and w.is_contiguous()
                and helper.available())

    def weight_tensors(self) -> list[torch.Tensor]:
        """The tensors the lookup and the head read (hugepages.gather_ may move them)."""
        return [self.weight]

    def _c_logits(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D] -> [T, V] fp32
        x = x.to(torch.float32).contiguous()
        out = torch.empty(x.shape[0], self.weight.shape[0], dtype=torch.float32)
        return helper.gemv_f16(self.weight, x, out, cpu_c.num_threads())

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()


class Q8TiedEmbedding:
    """The tied embedding kept as the GGUF ships it, Q8_0 (int8, an fp16 scale per 32):
    the LM head is one int8 x int8 GEMV (q8_gemv: x quantized per 32 like W4A8's rows),
    reading 34 bytes per 32 weights where the fp16 head reads 64. A lookup dequantizes only
    the looked-up rows, in fp32 (w = scale * q exactly)."""

    def __init__(self, packed):
        from engined.ops import registry

        self.packed = packed  # ops.q8_gemv.reference.PackedQ8
        self._head = registry.resolve("q8_tiles" if packed.tiles else "q8_gemv",
                                      packed.q.device.type).fn

    def to_tiles_(self, back: bool = False):
        """The head into the CPU's tiles of 16 rows (q8_tiles: a verify step's rows cost a
        fraction of a lone row's pass), in place: the same tensors, rearranged; back=True
        undoes it. The lookup reads either layout."""
        from engined.ops import registry

        p = self.packed
        if p.tiles != back:
            return
        p.tile_in_place_(back)  # a block at a time: no second copy of a large head
        self.packed = type(p)(p.q, p.scales, tiles=not back)
        self._head = registry.resolve("q8_gemv" if back else "q8_tiles", p.q.device.type).fn

    def weight_tensors(self) -> list[torch.Tensor]:
        """The tensors the lookup and the head read (hugepages.gather_ may move them)."""
        return [self.packed.q, self.packed.scales]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        # tokens: [T] -> [T, D] fp32; on the CPU one C pass (helper.q8_embed), the same values
        p = self.packed
        if p.q.device.type == "cpu" and helper.available():
            return helper.q8_embed(p.q, p.scales, p.tiles, tokens)
        return p.dequantize(tokens, torch.float32)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D] fp32 -> [T, V] fp32
        if x.dtype is not torch.float32 or not x.is_contiguous():
            x = x.float().contiguous()
        return self._head(x, self.packed)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes
