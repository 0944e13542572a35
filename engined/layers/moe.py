"""Kimi-Linear FFNs (reference §2.5, §2.6): SwiGLU (dense layer 0, shared expert) and the
sigmoid-routed MoE. Mixing weights are the UNBIASED sigmoid scores (vLLM); the correction bias
only chooses experts (§8.10).

Expert banks are stacked: dense w1/w3 [E, I, D], w2 [E, D, I]; INT4 adds a leading E to each of
qweight/scales/mins (a symmetric bank has no mins). Letters: t token, e expert, k choice, i expert width, d hidden.
"""
import torch
import torch.nn.functional as F

from engined.layers.linear import SlotError
from engined.layers.mlp import SwiGLU
from engined.ops import int4_format, registry
from engined.ops.rowwise import rowwise
from engined.ops.moe_decode.reference import route
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts


class ExpertBank:
    """E stacked matrices of shape [N, K] (dense or INT4). `slot(part, e)` is expert e's tensor.
    int4: the bank's int4_format.Int4Layout (a bare int is an asymmetric group size) or None."""

    def __init__(self, num: int, out_features: int, in_features: int, dtype, device, int4=None):
        layout = int4_format.Int4Layout.of(int4)
        group_size = layout.group_size if layout else None
        self.group_size, self.shape = group_size, (out_features, in_features)
        self._packed = None
        if group_size is None:
            self.weight = torch.empty(num, out_features, in_features, dtype=dtype, device=device)
            return
        groups = in_features // group_size
        self.qweight = torch.empty(num, out_features, in_features // 2, dtype=torch.uint8, device=device)
        self.scales = torch.empty(num, out_features, groups, dtype=torch.float16, device=device)
        self.mins = (None if layout.symmetric else
                     torch.empty(num, out_features, groups, dtype=torch.float16, device=device))

    @property
    def banks(self) -> dict[str, torch.Tensor]:
        """Part name -> its stacked tensor [E, ...]."""
        if self.group_size is None:
            return {"weight": self.weight}
        if self.mins is None:
            return {"qweight": self.qweight, "scales": self.scales}
        return {"qweight": self.qweight, "scales": self.scales, "mins": self.mins}

    def slot(self, part: str, e: int) -> torch.Tensor:
        bank = self.banks.get(part)
        if bank is None:
            raise SlotError(f"expert bank is {'INT4' if self.group_size else 'dense'}; no {part!r}")
        if not 0 <= e < bank.shape[0]:
            raise SlotError(f"expert {e} out of range 0..{bank.shape[0] - 1}")
        return bank[e]

    @property
    def packed(self) -> PackedInt4Experts:
        if self._packed is None:  # one object: kernels cache per-object pointers
            self._packed = PackedInt4Experts(self.qweight, self.scales, self.mins, self.group_size)
        return self._packed

    def to_gpu_order_(self):
        """The codes in the GPU kernels' order (int4_format.gpu_order), in place, once loaded."""
        p = self.packed
        if p.tiles:
            raise ValueError("an expert bank in the CPU's tiles does not go into the GPU order")
        if not p.gpu_order:
            int4_format.to_gpu_order_(p.qweight, p.group_size)
            self._packed = PackedInt4Experts(p.qweight, p.scales, p.mins, p.group_size, True)

    def can_tile(self) -> bool:
        """Whether the C helper can read this bank in the CPU's tiles: INT4 on the CPU in
        the disk's order, rows of whole tiles, groups of whole blocks of 32."""
        return (self.group_size is not None and self.qweight.device.type == "cpu"
                and self.shape[0] % int4_format.TILE == 0 and self.group_size % 32 == 0
                and not self.packed.gpu_order)

    def to_tiles_(self, back: bool = False):
        """Every expert into the CPU's tiles (PackedInt4Experts.to_tiles's layout), in place a
        block of rows at a time, or back (back=True)."""
        p = self.packed
        if p.tiles != back:
            return
        int4_format.tile_in_place_(p.flat(), back)
        self._packed = PackedInt4Experts(p.qweight, p.scales, p.mins, p.group_size,
                                         tiles=not back)

    def matrix(self, e: int, dtype) -> torch.Tensor:
        """Expert e's W: [N, K] in dtype."""
        if self.group_size is None:
            return self.weight[e].to(dtype)
        return int4_format.dequantize(self.packed.expert(e)).to(dtype)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.banks.values())


DECODE_ROWS = 16  # up to this many rows (the decode buckets) run the fused moe_decode


def scope(int4: dict[str, int], prefix: str) -> dict[str, int]:
    """INT4 group sizes keyed by dotted path -> those under `prefix`, relative to it."""
    head = prefix + "."
    return {k[len(head):]: g for k, g in int4.items() if k.startswith(head)}


class MoE:
    def __init__(self, hidden: int, inner: int, num_experts: int, top_k: int, num_shared: int,
                 renormalize: bool, scaling: float, dtype, device="cpu", int4: dict[str, int] | None = None,
                 host_experts=None):
        """host_experts: a moe_offload.HostExperts when this layer's routed experts live in
        RAM (their banks are then allocated on the CPU, the rest on `device`)."""
        int4 = int4 or {}
        self.host_experts = host_experts
        bank_device = "cpu" if host_experts is not None else device
        self.top_k, self.renormalize, self.scaling = top_k, renormalize, scaling
        # router [E, D] kept in fp32 (logits are fp32 as in HF/vLLM): no per-step cast of a bf16 copy
        self.gate = torch.empty(num_experts, hidden, dtype=torch.float32, device=device)
        # its bias too (vLLM keeps it fp32): in bf16, a checkpoint's fp32 bias loses the
        # differences that pick between near-tied experts
        self.e_score_correction_bias = torch.empty(num_experts, dtype=torch.float32, device=device)
        self.w1 = ExpertBank(num_experts, inner, hidden, dtype, bank_device, int4.get("w1"))
        self.w3 = ExpertBank(num_experts, inner, hidden, dtype, bank_device, int4.get("w3"))
        self.w2 = ExpertBank(num_experts, hidden, inner, dtype, bank_device, int4.get("w2"))
        self.shared_experts = (SwiGLU.empty(hidden, inner * num_shared, dtype, device,
                                            scope(int4, "shared_experts")) if num_shared else None)
        shared = scope(int4, "shared_experts")
        layouts = [int4.get(n) for n in ("w1", "w3", "w2")] + (
            [shared.get(n) for n in ("gate_proj", "up_proj", "down_proj")] if num_shared else [])
        # decode rows run moe_decode: every matrix INT4 in one layout, the experts on this
        # device, the shared expert (at most one) as wide as a routed one, its gate/up stacked
        self.fused_decode = (host_experts is None and num_shared <= 1 and None not in layouts
                             and len({str(int4_format.Int4Layout.of(x)) for x in layouts}) == 1)
        self.cpu_experts = "moe_grouped"   # the op of INT4 routed experts the CPU runs
        self.route_observer = None  # bench/route_trace.py: each call's router picks [T, k]

    def select_experts(self, op: str):
        """The op of the routed experts the CPU runs (here, or in RAM beside a GPU): moe_grouped
        (W4A16) or moe_grouped_w4a8 (x and h rounded to int8, integer dots; opt-in); the
        banks in RAM go into the CPU's tiles where the op's C variant runs them, or back."""
        if op == "moe_grouped_w4a8" and self.w1.group_size % 32:
            raise ValueError(f"W4A8 routed experts take INT4 groups of a multiple of 32, these "
                             f"are groups of {self.w1.group_size}: drop --moe-w4a8, or "
                             "re-quantize with --group-size 32")
        self.cpu_experts = op
        if self.host_experts is not None:
            self.host_experts.select(op)
        # the C helper reads the banks in the CPU's tiles (csrc/kimi_moe_tiles.c: 16 outputs
        # a vector instruction, W4A8 and W4A16 alike); a VRAM cache uploads from them
        banks = (self.w1, self.w3, self.w2)
        in_ram = [b for b in banks if b.group_size is not None and b.qweight.device.type == "cpu"]
        if not in_ram:      # every expert on a GPU: nothing here for the CPU to run
            return
        tiles = registry.resolve(op, "cpu").name == "cpu_c" and all(b.can_tile() for b in banks)
        for bank in in_ram:
            bank.to_tiles_(back=not tiles)
        if self.host_experts is not None and self.host_experts.cache is not None:
            self.host_experts.cache.follow_(tiles)

    def __call__(self, f: torch.Tensor) -> torch.Tensor:
        """f: [T, D] -> [T, D]: a prefill chunk, one decode token, or the decode rows of B
        sequences alike. The router and the shared experts run once for all rows; INT4 banks
        run the registered moe_grouped op (each chosen expert read once for all the rows that
        chose it, and a row's result independent of the rows beside it)."""
        is_decode = f.shape[0] <= DECODE_ROWS
        logits = self._logits(f, is_decode)                     # [T, E] fp32
        if self.route_observer is not None:
            self.route_observer(self._route(logits, is_decode)[0])
        on_cpu = registry.runs_as(f.device.type) == "cpu"
        if self.fused_decode and is_decode and (self.cpu_experts == "moe_grouped" or not on_cpu):
            shared = self.shared_experts
            return registry.resolve("moe_decode", f.device.type).fn(
                f, logits, self.e_score_correction_bias, self.top_k, self.renormalize,
                self.scaling, self.w1.packed, self.w3.packed, self.w2.packed,
                *((shared.gate_up.packed, shared.down_proj.packed) if shared else (None, None)))
        experts, weights = self._route(logits, is_decode)
        if self.host_experts is not None:                       # routed experts in RAM
            return self.host_experts(f, experts, weights, (self.w1, self.w3, self.w2),
                                     self.shared_experts)
        if self.w1.group_size and self.w3.group_size and self.w2.group_size:
            routed = registry.resolve(self.cpu_experts if on_cpu else "moe_grouped", f.device.type).fn(
                f, self.w1.packed, self.w3.packed, self.w2.packed, experts, weights)
        elif f.shape[0] == 1 or (is_decode and on_cpu):          # row-exact on the CPU
            routed = torch.cat([self._dense_one(f[b:b + 1], experts[b], weights[b])
                                for b in range(f.shape[0])])
        else:
            routed = self._dense(f, experts, weights)
        routed = routed.to(f.dtype)
        return routed + self.shared_experts(f) if self.shared_experts is not None else routed

    def route_rows(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """f: [T, D] -> the router's choice: experts [T, k] int64, weights [T, k] fp32."""
        is_decode = f.shape[0] <= DECODE_ROWS
        return self._route(self._logits(f, is_decode), is_decode)

    def _logits(self, f: torch.Tensor, is_decode: bool) -> torch.Tensor:
        """The router's logits [T, E] fp32; decode rows each alone on the CPU (ops/rowwise.py)."""
        router = lambda x: x.float() @ self.gate.t()  # noqa: E731
        return rowwise(router, f) if is_decode else router(f)

    def _route(self, logits: torch.Tensor, is_decode: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode rows each alone on the CPU (ops/rowwise.py); a chunk's rows through moe_route."""
        if is_decode:
            return rowwise(lambda x: route(x, self.e_score_correction_bias, self.top_k,
                                           self.renormalize, self.scaling), logits)
        experts = torch.empty((logits.shape[0], self.top_k), dtype=torch.int64, device=logits.device)
        weights = registry.resolve("moe_route", logits.device.type).fn(
            logits, self.e_score_correction_bias, self.top_k, self.renormalize, self.scaling, experts)
        return experts, weights

    def _dense(self, f, experts, weights) -> torch.Tensor:
        """Dense banks: Σ_k w_k Expert_{e_k}(f), summed in fp32, one pass per chosen expert."""
        out = torch.zeros(f.shape, dtype=torch.float32, device=f.device)
        for e in torch.unique(experts).tolist():
            tok, choice = (experts == e).nonzero(as_tuple=True)
            x = f[tok]                                          # [n, D]
            h = F.silu(x @ self.w1.matrix(e, f.dtype).t()) * (x @ self.w3.matrix(e, f.dtype).t())
            y = (h @ self.w2.matrix(e, f.dtype).t()).float()    # [n, D]
            out.index_add_(0, tok, y * weights[tok, choice].unsqueeze(-1))
        return out

    def _dense_one(self, f, ids, weights) -> torch.Tensor:
        """Dense banks, one token, no host sync: gather the k chosen experts.
        f: [1, D]; ids, weights: [k] -> [1, D] fp32."""
        x = f[0]
        w1, w3, w2 = (bank.weight[ids].to(f.dtype) for bank in (self.w1, self.w3, self.w2))
        h = F.silu(torch.einsum("d,kid->ki", x, w1)) * torch.einsum("d,kid->ki", x, w3)
        y = torch.einsum("ki,kdi->kd", h, w2).float()
        return (weights.unsqueeze(-1) * y).sum(0, keepdim=True)
