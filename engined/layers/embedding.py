import torch
import torch.nn.functional as F

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

    The head runs in the weight's dtype (fp16 halves the bytes read per token; see
    engined/ops/README.md for the measured choice) and returns fp32 logits."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        # tokens: [T] -> [T, D] fp32
        return self.weight[tokens].float()

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D] fp32 -> [T, V] fp32
        return F.linear(x.to(self.weight.dtype), self.weight).float()

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()
