"""The packed-INT4 weight format (version 2) shared by every INT4 path in kimi-local.

The full description, with worked examples, the metadata keys and the GGUF Q4_1 reorder,
is engined/ops/README.md (the one place it is documented). In short, per quantized linear
W[N, K] with group size G (K % G == 0, G even), one of two kinds:
    <name>.qweight  uint8 [N, K/2]   unsigned codes q in 0..15, element 2j in the low nibble
    <name>.scales   fp16  [N, K/G]   s
    <name>.mins     fp16  [N, K/G]   m        asymmetric only:  w = s * q + m
                                              symmetric (no mins): w = s * (q - 8)
The safetensors __metadata__ carries FORMAT_KEY = FORMAT_NAME, VERSION_KEY = FORMAT_VERSION
and, per quantized linear, "<name>.group_size" = str(G) and "<name>.scheme" = "symmetric" or
"asymmetric" (recorded, never guessed). Loaders refuse anything else, version 1 included.
"""
from dataclasses import dataclass

import torch

FORMAT_KEY = "kimi.format"
FORMAT_NAME = "kimi-packed-int4"
VERSION_KEY = "kimi.format_version"
FORMAT_VERSION = "2"
SUFFIXES = (".qweight", ".scales", ".mins")  # every part a linear can have
SYMMETRIC, ASYMMETRIC = "symmetric", "asymmetric"
SYMMETRIC_OFFSET = 8  # a symmetric code c in -8..7 is stored as q = c + 8


class FormatError(ValueError):
    """An artifact is not in a packed-INT4 format this build understands."""


@dataclass(frozen=True)
class Int4Layout:
    """How one quantized linear is stored: its group size and kind (symmetric: no mins)."""

    group_size: int
    symmetric: bool = False

    @property
    def scheme(self) -> str:
        return SYMMETRIC if self.symmetric else ASYMMETRIC

    @property
    def parts(self) -> tuple[str, ...]:
        """The tensors of one such linear: qweight, scales (and mins when asymmetric)."""
        return ("qweight", "scales") if self.symmetric else ("qweight", "scales", "mins")

    @classmethod
    def of(cls, spec: "Int4Layout | int | None") -> "Int4Layout | None":
        """A layout, or None for a dense linear; a bare int is an asymmetric group size."""
        if spec is None or isinstance(spec, Int4Layout):
            return spec
        return cls(int(spec))


@dataclass(frozen=True)
class PackedInt4:
    """One quantized linear. qweight: [N, K/2] uint8; scales, mins: [N, K/G] fp16.
    mins is None for a symmetric linear (w = s * (q - 8))."""

    qweight: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None
    group_size: int
    gpu_order: bool = False  # codes permuted in each group for the GPU kernels (to_gpu_order)
    tiles: bool = False      # codes and scales in the CPU's tiles of 16 rows (to_tiles)

    @property
    def shape(self) -> tuple[int, int]:
        return self.qweight.shape[0], self.qweight.shape[1] * 2

    @property
    def symmetric(self) -> bool:
        return self.mins is None

    @property
    def layout(self) -> Int4Layout:
        return Int4Layout(self.group_size, self.symmetric)

    def __post_init__(self):
        n, half_k = self.qweight.shape
        g = self.group_size
        if self.qweight.dtype != torch.uint8:
            raise FormatError(f"qweight must be uint8, got {self.qweight.dtype}")
        if g <= 0 or g % 2 or (2 * half_k) % g:
            raise FormatError(f"group size {g} does not divide K={2 * half_k} into even groups")
        want = (n, 2 * half_k // g)
        for name, t in (("scales", self.scales), ("mins", self.mins)):
            if t is None and name == "mins":
                continue
            if tuple(t.shape) != want or t.dtype != torch.float16:
                raise FormatError(f"{name} must be fp16 {want}, got {t.dtype} {tuple(t.shape)}")


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """codes: [N, K] integers in 0..15 -> qweight [N, K/2] uint8 (2j low nibble, 2j+1 high)."""
    if codes.shape[-1] % 2:
        raise FormatError(f"K={codes.shape[-1]} must be even")
    c = codes.to(torch.uint8)
    if int(c.max()) > 15:
        raise FormatError("INT4 codes must lie in 0..15")
    return _pack(c)


def _pack(c: torch.Tensor) -> torch.Tensor:
    """pack_codes of codes known to be 4-bit (unpacked from a qweight): no check, so no read
    of the data by the host, which on a GPU would wait for the stream (an upload's)."""
    return c[:, 0::2] | (c[:, 1::2] << 4)


def unpack_codes(qweight: torch.Tensor) -> torch.Tensor:
    """qweight [N, K/2] uint8 -> codes [N, K] uint8."""
    low, high = qweight & 0x0F, qweight >> 4
    return torch.stack((low, high), dim=-1).reshape(qweight.shape[0], -1)


def gpu_order(qweight: torch.Tensor, group: int, back: bool = False) -> torch.Tensor:
    """The codes of qweight [..., K/2] (a new tensor) in the GPU kernels' order within each group
    of G: word w (bytes 4w..4w+3 of the group) holds elements i*(G/8) + w in nibbles i = 0..7,
    so the x a nibble position multiplies is G/8 contiguous values (on disk, word w holds
    elements 8w..8w+7). back=True undoes it. G must be a multiple of 8."""
    half_k = qweight.shape[-1]
    k, words = 2 * half_k, group // 8
    if group % 8 or k % group:
        raise FormatError(f"the GPU order needs groups of whole 32-bit words, got G={group}, K={k}")
    codes = unpack_codes(qweight.reshape(-1, half_k))            # [R, K]
    by_group = codes.view(-1, k // group, *((words, 8) if back else (8, words)))
    return _pack(by_group.transpose(-1, -2).reshape(-1, k)).view(qweight.shape)


def to_gpu_order_(qweight: torch.Tensor, group: int, block_bytes: int = 64 << 20):
    """gpu_order in place, a block of rows at a time (an expert bank is 300 MB at 48B sizes)."""
    rows = qweight.view(-1, qweight.shape[-1])
    step = max(1, block_bytes // rows.shape[1])
    for first in range(0, rows.shape[0], step):
        rows[first:first + step] = gpu_order(rows[first:first + step], group)


TILE = 16  # output rows per tile (csrc/kimi_tiles.h)


def can_tile(p: PackedInt4) -> bool:
    """Whether the CPU's tiles take this linear: rows a multiple of TILE, groups of whole
    blocks of 32 (the tile kernels round x per block of 32), codes in the disk's order."""
    n, _ = p.shape
    return n % TILE == 0 and p.group_size % 32 == 0 and not p.gpu_order and not p.tiles


def tile_tensors(p: PackedInt4, back: bool = False) -> tuple[torch.Tensor, ...]:
    """The tensors of p (new ones, the same shapes) in the CPU's tiles, or back from them.

    Per tile t of rows 16t..16t+15 and chunk c of inputs 8c..8c+7, 64 bytes: 4 per row j, byte
    i holding the codes of inputs 8c + i (low nibble) and 8c + 4 + i (high nibble); scales and
    mins [n/16, k/G, 16]. The tiles of rows [16a, 16b) are rows [16a, 16b) of the result, so a
    view of whole tiles is a linear in tiles too."""
    n, k = p.shape
    if n % TILE or k % 8:
        raise FormatError(f"tiles need N % {TILE} == 0 and K % 8 == 0, got {n} x {k}")
    if back:  # [N/16, K/8, 16, 4] bytes -> codes [N/16, 16, K/8, 2, 4]
        b = p.qweight.reshape(n // TILE, k // 8, TILE, 4)
        codes = torch.stack((b & 0x0F, b >> 4), dim=-1).permute(0, 2, 1, 4, 3)
        qweight = _pack(codes.reshape(n, k))
    else:     # codes [N/16, 16, K/8, 2 (halves of 4), 4] -> [N/16, K/8, 16, 4, 2]
        codes = unpack_codes(p.qweight).view(n // TILE, TILE, k // 8, 2, 4)
        c = codes.permute(0, 2, 1, 4, 3)
        qweight = (c[..., 0] | (c[..., 1] << 4)).reshape(n, k // 2)
    groups = k // p.group_size

    def regroup(t: torch.Tensor) -> torch.Tensor:  # [N/16, 16, G] <-> [N/16, G, 16]
        shape = (n // TILE, groups, TILE) if back else (n // TILE, TILE, groups)
        return t.reshape(shape).transpose(1, 2).reshape(n, groups).contiguous()
    mins = None if p.mins is None else regroup(p.mins)
    return qweight.contiguous(), regroup(p.scales), mins


def tile_in_place_(p: PackedInt4, back: bool = False):
    """tile_tensors written back into p's own tensors: by the C helper where it is built
    (helper.tile_int4: a tile at a time on its pool, 12x torch's permutes: 0.13 against 1.6 s
    for a Kimi expert bank on 2 threads), else by tile_blocks_."""
    from engined import helper
    if helper.available() and p.qweight.is_cpu:
        helper.tile_int4(p.qweight, p.scales, p.mins, p.group_size, back)
    else:
        tile_blocks_(p, back)


def tile_blocks_(p: PackedInt4, back: bool = False, block_rows: int = 4096):
    """tile_in_place_ in torch, block_rows rows (a multiple of TILE) at a time: a block's tiles
    are that block's bytes, so the transient copy is one block, not W."""
    n, _ = p.shape
    for start in range(0, n, block_rows):
        end = min(start + block_rows, n)
        block = PackedInt4(p.qweight[start:end], p.scales[start:end],
                           None if p.mins is None else p.mins[start:end], p.group_size,
                           tiles=p.tiles)
        for dst, src in zip((block.qweight, block.scales, block.mins), tile_tensors(block, back)):
            if dst is not None and src.data_ptr() != dst.data_ptr():  # one group: a view of dst
                dst.copy_(src)


def to_tiles(p: PackedInt4) -> PackedInt4:
    """p with its codes and scales in the CPU's tiles (new tensors)."""
    if not can_tile(p):
        raise FormatError(f"a {p.shape[0]} x {p.shape[1]} linear with groups of {p.group_size}"
                          f"{' in the GPU order' if p.gpu_order else ''} does not go into tiles")
    return PackedInt4(*tile_tensors(p), p.group_size, tiles=True)


def from_tiles(p: PackedInt4) -> PackedInt4:
    """p back in the disk's layout (new tensors)."""
    return PackedInt4(*tile_tensors(p, back=True), p.group_size) if p.tiles else p


def dequantize(p: PackedInt4) -> torch.Tensor:
    """The reference decode, in fp32: W[N, K] = s * q + m, or s * (q - 8) when symmetric
    (exact: an fp16 scale times a 4-bit integer fits an fp32 mantissa)."""
    p = from_tiles(p)
    n, k = p.shape
    g = p.group_size
    q = unpack_codes(gpu_order(p.qweight, g, back=True) if p.gpu_order else p.qweight)
    q = q.float().view(n, k // g, g)
    if p.symmetric:
        return ((q - SYMMETRIC_OFFSET) * p.scales.float().unsqueeze(-1)).view(n, k)
    w = q * p.scales.float().unsqueeze(-1) + p.mins.float().unsqueeze(-1)
    return w.view(n, k)


def quantize_asym(w: torch.Tensor, group_size: int = 32) -> PackedInt4:
    """Asymmetric min/max INT4 (the Q4_1 scheme): per group s = (max-min)/15, m = min."""
    n, k = w.shape
    if k % group_size:
        raise FormatError(f"K={k} is not a multiple of group size {group_size}")
    wg = w.float().view(n, k // group_size, group_size)
    lo, hi = wg.amin(-1), wg.amax(-1)
    scales = ((hi - lo) / 15).to(torch.float16)
    mins = lo.to(torch.float16)
    s = scales.float().clamp_min(torch.finfo(torch.float16).tiny).unsqueeze(-1)
    codes = torch.round((wg - mins.float().unsqueeze(-1)) / s).clamp(0, 15).view(n, k)
    return PackedInt4(pack_codes(codes), scales, mins, group_size)


def quantize_sym(w: torch.Tensor, group_size: int = 32) -> PackedInt4:
    """Symmetric INT4 (the Kimi-Linear scheme): c in -7..7, s = absmax/7; stored q = c + 8,
    no mins."""
    n, k = w.shape
    if k % group_size:
        raise FormatError(f"K={k} is not a multiple of group size {group_size}")
    wg = w.float().view(n, k // group_size, group_size)
    absmax = wg.abs().amax(-1)
    scales = torch.where(absmax > 0, absmax / 7, torch.ones_like(absmax)).to(torch.float16)
    c = torch.round(wg / scales.float().unsqueeze(-1)).clamp(-7, 7)
    codes = (c + SYMMETRIC_OFFSET).view(n, k)
    return PackedInt4(pack_codes(codes), scales, None, group_size)


def to_state_dict(name: str, p: PackedInt4) -> dict[str, torch.Tensor]:
    """<name>.qweight, <name>.scales and, for an asymmetric linear, <name>.mins."""
    if p.gpu_order or p.tiles:
        raise FormatError(f"{name}: codes in the GPU's order or the CPU's tiles are never "
                          "written (format version 2 is the on-disk order)")
    out = {name + ".qweight": p.qweight, name + ".scales": p.scales}
    if not p.symmetric:
        out[name + ".mins"] = p.mins
    return out


def metadata(layouts: dict[str, Int4Layout]) -> dict[str, str]:
    """safetensors __metadata__ for an artifact with these quantized linears."""
    meta = {FORMAT_KEY: FORMAT_NAME, VERSION_KEY: FORMAT_VERSION}
    for name, layout in layouts.items():
        meta[f"{name}.group_size"] = str(layout.group_size)
        meta[f"{name}.scheme"] = layout.scheme
    return meta


def layout(name: str, meta: dict[str, str]) -> Int4Layout:
    """The recorded group size and kind of quantized linear `name` (metadata already checked)."""
    g, scheme = meta.get(f"{name}.group_size"), meta.get(f"{name}.scheme")
    if g is None:
        raise FormatError(f"{name}: group size missing from metadata")
    if scheme not in (SYMMETRIC, ASYMMETRIC):
        raise FormatError(f"{name}: scheme {scheme!r} in metadata is not "
                          f"{SYMMETRIC!r} or {ASYMMETRIC!r}")
    return Int4Layout(int(g), scheme == SYMMETRIC)


def check_metadata(meta: dict[str, str] | None, source: str = "artifact"):
    """Refuse an artifact whose format name or version this build does not know."""
    meta = meta or {}
    if meta.get(FORMAT_KEY) != FORMAT_NAME:
        raise FormatError(f"{source}: not a {FORMAT_NAME} artifact "
                          f"({FORMAT_KEY}={meta.get(FORMAT_KEY)!r})")
    if meta.get(VERSION_KEY) != FORMAT_VERSION:
        raise FormatError(f"{source}: {FORMAT_NAME} version {meta.get(VERSION_KEY)!r} is not "
                          f"supported (this build reads version {FORMAT_VERSION}); re-quantize "
                          "it (`kimi-engine quantize`; a GGUF's cached repack rebuilds itself)")


def from_state_dict(name: str, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> PackedInt4:
    """Collect <name>.qweight/.scales(/.mins) by its recorded layout (metadata already checked);
    a symmetric linear with mins, or an asymmetric one without, is refused."""
    lay = layout(name, meta)
    has_mins = name + ".mins" in tensors
    if has_mins == lay.symmetric:
        raise FormatError(f"{name}: metadata says {lay.scheme} but the artifact "
                          f"{'has' if has_mins else 'lacks'} {name}.mins")
    return PackedInt4(tensors[name + ".qweight"], tensors[name + ".scales"],
                      tensors[name + ".mins"] if has_mins else None, lay.group_size)
