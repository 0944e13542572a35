"""One linear for both models: y = x @ W^T with W dense (bf16/fp32) or packed INT4.

A linear is either built around loaded tensors (`from_packed`, the Llama loader) or
allocated empty and filled slot by slot through a checkpoint table (`Linear(...)` + `slot`,
the Kimi-Linear loader). Decode rows (M <= helper.MAX_ROWS) of an INT4 weight run the
registered w4a16_gemv variant; longer inputs (prefill chunks) run w4a16_gemm (on the CPU the
C helper, which never holds W in fp32; on a GPU a Triton tl.dot tile that dequantizes W in its
K loop). A
linear put into the CPU's tiles (to_tiles_) runs w4a8_tiles (the Llama family) or w4a16_tiles
(Kimi-Linear) for any number of rows.
Imports nothing that needs cffi, so a GPU image without it can build a model.
"""
import torch
import torch.nn.functional as F

from engined import helper
from engined.ops import int4_format, registry
from engined.ops.rowwise import rowwise
from engined.ops.w4a16_gemv.cpu_c import num_threads

INT4_PARTS = ("qweight", "scales", "mins")
CAST_BLOCK_BYTES = 4 << 20  # a dense CPU weight of another dtype is cast this much at a time


class SlotError(ValueError):
    """A checkpoint tensor does not fit the slot it maps to."""


def fill(slot: torch.Tensor, tensor: torch.Tensor, what: str):
    """Copy one checkpoint tensor into its preallocated slot (shape must match, dtype is cast)."""
    if tuple(slot.shape) != tuple(tensor.shape):
        raise SlotError(f"{what}: checkpoint shape {tuple(tensor.shape)} != model shape "
                        f"{tuple(slot.shape)}")
    if slot.dtype == torch.uint8 and tensor.dtype != torch.uint8:
        raise SlotError(f"{what}: packed INT4 codes must be uint8, got {tensor.dtype}")
    slot.copy_(tensor)


class Linear:
    """W: [N, K] dense, or INT4 (qweight [N, K/2] u8, scales/mins [N, K/G] fp16; a symmetric
    INT4 linear has no mins). int4: its int4_format.Int4Layout (a bare int is an asymmetric
    group size), None for dense."""

    def __init__(self, out_features: int, in_features: int, dtype: torch.dtype,
                 device="cpu", int4: "int4_format.Int4Layout | int | None" = None):
        layout = int4_format.Int4Layout.of(int4)
        group_size = layout.group_size if layout else None
        self.out_features, self.in_features = out_features, in_features
        self.group_size = group_size
        self.device = torch.device(device)
        self._gemv = self._gemm = None  # resolved at the first call (a "meta" model never runs)
        self._gemv_selected = False     # select_gemv chose decode rows' GEMV
        self._packed = None
        if group_size is None:
            self.weight = torch.empty(out_features, in_features, dtype=dtype, device=device)
            return
        if in_features % group_size:
            raise SlotError(f"K={in_features} is not a multiple of group size {group_size}")
        groups = in_features // group_size
        self.qweight = torch.empty(out_features, in_features // 2, dtype=torch.uint8, device=device)
        self.scales = torch.empty(out_features, groups, dtype=torch.float16, device=device)
        self.mins = (None if layout.symmetric else
                     torch.empty(out_features, groups, dtype=torch.float16, device=device))

    @classmethod
    def from_packed(cls, packed: int4_format.PackedInt4, device="cpu") -> "Linear":
        """A linear around already loaded INT4 tensors (no copy)."""
        out_features, in_features = packed.shape
        lin = cls._around(out_features, in_features, packed.group_size, device)
        lin._packed = packed
        lin.qweight, lin.scales, lin.mins = packed.qweight, packed.scales, packed.mins
        return lin

    @classmethod
    def _around(cls, out_features: int, in_features: int, group_size, device) -> "Linear":
        """A linear with no tensors yet, for a caller that has them (from_packed, rows)."""
        lin = cls.__new__(cls)
        lin.out_features, lin.in_features, lin.group_size = out_features, in_features, group_size
        lin.device, lin._gemv, lin._gemm, lin._packed = torch.device(device), None, None, None
        lin._gemv_selected = False
        return lin

    @classmethod
    def stacked(cls, parts: list["Linear"], device="cpu") -> "Linear":
        """One INT4 linear whose output rows are the parts' rows in order (same K and group;
        rows keep their own scales and mins, so each output equals the part's, bit for bit, in
        one GEMV call instead of len(parts))."""
        ps = [lin.packed for lin in parts]
        if len({(p.shape[1], p.layout, p.gpu_order, p.tiles) for p in ps}) != 1:
            raise ValueError("stacked linears need the same in_features, group size, kind and "
                             "code order")
        mins = None if ps[0].symmetric else torch.cat([p.mins for p in ps])
        whole = cls.from_packed(int4_format.PackedInt4(  # tiles are whole rows: they stack too
            torch.cat([p.qweight for p in ps]), torch.cat([p.scales for p in ps]), mins,
            ps[0].group_size, ps[0].gpu_order, ps[0].tiles), device)
        if ps[0].tiles:  # the parts' tile op (w4a8_tiles or w4a16_tiles)
            whole._gemv, whole._gemv_selected = parts[0]._gemv, parts[0]._gemv_selected
        return whole

    @classmethod
    def split(cls, int4: dict, names: tuple[str, ...], sizes: tuple[int, ...], in_features: int,
              dtype, device="cpu") -> tuple["Linear | None", list["Linear"]]:
        """One linear of sum(sizes) output rows, allocated empty, and its parts: views of its
        rows in order, which a loader fills slot by slot (projections that share an input, run
        by one GEMV in decode; weight_tensors counts the stacked tensors once). int4: part name
        -> layout. Parts of different formats cannot share rows: (None, separate linears)."""
        if len({str(int4_format.Int4Layout.of(int4.get(n))) for n in names}) != 1:
            return None, [cls(n, in_features, dtype, device, int4.get(name))
                          for name, n in zip(names, sizes)]
        whole = cls(sum(sizes), in_features, dtype, device, int4.get(names[0]))
        starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        return whole, [whole.rows(a, b) for a, b in zip(starts, starts[1:])]

    def rows(self, start: int, end: int) -> "Linear":
        """Output rows [start, end) of this linear, as views (no copy)."""
        if not self.is_int4:
            part = Linear._around(end - start, self.in_features, None, self.device)
            part.weight = self.weight[start:end]
            return part
        p = self.packed
        if p.tiles and (start % int4_format.TILE or end % int4_format.TILE):
            raise ValueError(f"rows [{start}, {end}) of a linear in tiles of "
                             f"{int4_format.TILE}: not whole tiles")
        mins = None if p.symmetric else p.mins[start:end]
        part = Linear.from_packed(int4_format.PackedInt4(
            p.qweight[start:end], p.scales[start:end], mins, p.group_size, p.gpu_order, p.tiles),
            self.device)
        if p.tiles:  # the whole's tile op (w4a8_tiles or w4a16_tiles)
            part._gemv, part._gemv_selected = self._gemv, self._gemv_selected
        return part

    @property
    def is_int4(self) -> bool:
        return self.group_size is not None

    def slot(self, part: str) -> torch.Tensor:
        """The tensor a loader fills for `part` (checkpoint tables name parts, never attributes)."""
        if part == "weight" and not self.is_int4:
            return self.weight
        if part in INT4_PARTS and self.is_int4 and not (part == "mins" and self.mins is None):
            return {"qweight": self.qweight, "scales": self.scales, "mins": self.mins}[part]
        kind = ("symmetric INT4" if self.mins is None else "INT4") if self.is_int4 else "dense"
        raise SlotError(f"this projection is {kind}; it has no {part!r} tensor")

    @property
    def packed(self) -> int4_format.PackedInt4:
        """One object for the life of the linear (kernels cache per-object pointers); a loader
        fills the same tensors in place, so building it late is safe."""
        if self._packed is None:
            self._packed = int4_format.PackedInt4(self.qweight, self.scales, self.mins,
                                                  self.group_size)
        return self._packed

    def to_gpu_order_(self, permute: bool = True):
        """The codes in the GPU kernels' order (int4_format.gpu_order), in place, once loaded.
        permute=False only marks a view whose base was permuted (q_proj, rows of qkv)."""
        p = self.packed
        if p.tiles:
            raise ValueError("a linear in the CPU's tiles does not go into the GPU order")
        if p.gpu_order:
            return
        if permute:
            int4_format.to_gpu_order_(p.qweight, p.group_size)
        self._packed = int4_format.PackedInt4(p.qweight, p.scales, p.mins, p.group_size, True)

    def to_tiles_(self, back: bool = False, op: str = "w4a8_tiles", permute: bool = True):
        """Codes and scales into the CPU's tiles (int4_format.tile_tensors), in place: the
        same tensors, so no second copy of W, and every row of x, decode or prefill, then runs
        `op` (w4a8_tiles, or w4a16_tiles: x rounded to int16). back=True returns them to the
        disk's layout (decode rows then run w4a16_gemv until select_gemv says otherwise).
        permute=False marks a view whose base moves its bytes. Views of rows made before are
        stale."""
        p = self.packed
        if p.tiles == back:
            if permute:
                int4_format.tile_in_place_(p, back)
            self._packed = int4_format.PackedInt4(p.qweight, p.scales, p.mins, p.group_size,
                                                  tiles=not back)
            self._gemm = None
            if back:
                self._gemv, self._gemv_selected = None, False
        if not back:
            self.select_gemv(op)

    def dense_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """W: [N, K] in dtype (dequantized for INT4: the C helper on CPU, else the reference)."""
        if not self.is_int4:
            return self.weight.to(dtype)
        p = self.packed
        if p.qweight.device.type == "cpu" and helper.available() and not (p.gpu_order or p.tiles):
            mins = None if p.symmetric else p.mins.numpy()
            w = helper.unpack_int4(p.qweight.numpy(), p.scales.numpy(), mins, p.group_size)
            return torch.from_numpy(w).to(dtype)
        return int4_format.dequantize(p).to(dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, K] -> [T, N] in x.dtype
        if not self.is_int4:
            if self._is_c_bf16(x):                   # decode rows: 2 bytes a weight, no cast
                return helper.gemv_bf16(self.weight, x, None, num_threads()).to(x.dtype)
            if self.weight.dtype == x.dtype or self.device.type != "cpu":
                w = self.weight.to(x.dtype)                  # no-op cast when dtypes agree
                if x.shape[0] <= helper.MAX_ROWS:            # decode rows: row-exact on the CPU
                    return rowwise(F.linear, x, w)
                return F.linear(x, w)
            return self._cast_by_blocks(x)
        if x.shape[0] <= helper.MAX_ROWS or self.packed.tiles:  # tiles: any rows, one op
            if self._gemv is None:
                op = "w4a8_tiles" if self.packed.tiles else "w4a16_gemv"
                self._gemv = registry.resolve(op, self.device.type).fn
            return self._gemv(x, self.packed).to(x.dtype)
        if self._gemm is None:
            self._gemm = registry.resolve("w4a16_gemm", self.device.type).fn
        if x.dtype == torch.float32:
            return self._gemm(x, self.packed)
        # 16-bit rows: the GEMM rounds its fp32 sums into x's dtype as it stores (no cast after)
        return self._gemm(x, self.packed, out=x.new_empty((x.shape[0], self.packed.shape[0])))

    def _is_c_bf16(self, x: torch.Tensor) -> bool:
        """A bf16 CPU weight under fp32 decode rows: the C bf16 GEMV (a row's result does not
        depend on its batch; longer inputs keep the blockwise cast and one matmul)."""
        w = self.weight
        return (w.dtype == torch.bfloat16 and x.dtype == torch.float32 and w.device.type == "cpu"
                and x.shape[0] <= helper.MAX_ROWS and w.is_contiguous() and helper.available())

    def _cast_by_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """A CPU weight stored narrower than x (bf16 under fp32 activations), cast one block of
        rows at a time: casting it whole costs N*K*4 bytes per call (1.5 GB per step for
        Kimi-Linear 48B's bf16 163840 x 2304 head). Each block's outputs equal F.linear's."""
        rows = max(1, CAST_BLOCK_BYTES // (self.in_features * x.element_size()))
        out = x.new_empty(x.shape[0], self.out_features)  # [T, N]
        linear = (lambda xs, w: rowwise(F.linear, xs, w)) if x.shape[0] <= helper.MAX_ROWS else F.linear
        for start in range(0, self.out_features, rows):
            w = self.weight[start:start + rows].to(x.dtype)
            out[:, start:start + w.shape[0]] = linear(x, w)   # decode rows: row-exact
        return out

    def swiglu(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for decode rows x [M, K] of this stacked [gate; up] INT4 linear ->
        [M, F]: one w4a16_swiglu pass, or, when select_gemv chose another GEMV for it (W4A8,
        a pinned reference), that GEMV, then silu and the product."""
        if not (self._gemv_selected or self.packed.tiles):
            return registry.resolve("w4a16_swiglu", self.device.type).fn(x, self.packed)
        gate_up, f = self(x), self.out_features // 2
        return F.silu(gate_up[:, :f]).mul_(gate_up[:, f:])

    def select_gemv(self, op: str = "w4a16_gemv", variant: str | None = None):
        """Run decode rows through `op`, an op with w4a16_gemv's signature (e.g. w4a8_gemv);
        resolved now, on this linear's device (bench/quality.py compares the two), or pinned
        to `variant` (the llama_decode_layer reference pins the plain references)."""
        self._gemv_selected = True
        self._gemv = (registry.resolve(op, self.device.type) if variant is None
                      else registry.variants(op)[variant]).fn

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        if not self.is_int4:
            return (self.weight,)
        parts = (self.qweight, self.scales, self.mins)
        return parts[:2] if self.mins is None else parts

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)


def run_split(whole: Linear | None, parts: list[Linear], x: torch.Tensor) -> torch.Tensor:
    """x through Linear.split's result: one GEMV, or the separate parts' outputs side by side."""
    return whole(x) if whole is not None else torch.cat([p(x) for p in parts], dim=-1)
