"""Plain fp32 reference for paged_mla_decode: the absorbed MLA attention of one decode token for
each of B sequences, each over its own latent rows 0..lengths[b]-1, which live in fixed-size
blocks of a layer's pool and are found through the row's block table (reference §2.4; vLLM's
paged attention, FlashMLA's block table).

| tensor       | shape              | dtype                                            |
|--------------|--------------------|--------------------------------------------------|
| q_lat        | [B, H, R]          | fp32: the nope query folded into latent space    |
| q_rope       | [B, H, P]          | fp32: the query's rope slice                     |
| pool         | [NB, BLOCK, R + P] | any float: rows [ĉ (R) ; kr (P)], NB blocks      |
| block_tables | [B, MB]            | int64; entries past cdiv(lengths[b], BLOCK) are padding (any value) |
| lengths      | [B]                | int64, 1 <= lengths[b] <= MB * BLOCK             |
| out          | [B, H, R]          | fp32                                             |

Per row b, with S = lengths[b] keys: position s lives at pool[table[s // BLOCK], s % BLOCK];
scores = scale (q_lat ĉ_s + q_rope kr_s); out = softmax(scores) @ ĉ (mixed latents; W_UV stays
in the layer).
"""
import torch

from engined.ops import registry


def check_inputs(q_lat, q_rope, pool, block_tables, lengths):
    b, h, r = q_lat.shape
    if q_rope.dim() != 3 or q_rope.shape[:2] != (b, h):
        raise ValueError(f"paged_mla_decode: q_lat [B, H, R], q_rope [B, H, P] needed, got "
                         f"{list(q_lat.shape)} {list(q_rope.shape)}")
    check_paged_rows("paged_mla_decode", b, r + q_rope.shape[2], pool, block_tables, "lengths",
                     lengths)


def check_paged_rows(what: str, b: int, width: int, pool, block_tables, name: str, per_row):
    """The checks every op on a paged latent pool shares: pool [NB, BLOCK, width], B rows of
    block tables [B, MB] and of one integer per row (`name`: lengths, positions)."""
    if pool.dim() != 3 or pool.shape[2] != width:
        raise ValueError(f"{what}: pool must be [NB, BLOCK, {width}], got {list(pool.shape)}")
    if block_tables.dim() != 2 or block_tables.shape[0] != b or block_tables.is_floating_point():
        raise ValueError(f"{what}: block_tables must be [{b}, MB] integers, got "
                         f"{block_tables.dtype} {list(block_tables.shape)}")
    if per_row.shape != (b,) or per_row.is_floating_point():
        raise ValueError(f"{what}: {name} must be [{b}] integers, got "
                         f"{per_row.dtype} {list(per_row.shape)}")


@registry.register("paged_mla_decode", registry.REFERENCE,
                   description="per row: gather its blocks, softmax over its own keys")
def paged_mla_decode(q_lat, q_rope, pool, block_tables, lengths, scale: float,
                     out=None) -> torch.Tensor:
    check_inputs(q_lat, q_rope, pool, block_tables, lengths)
    r, block = q_lat.shape[2], pool.shape[1]
    rows = []
    for b, n in enumerate(lengths.tolist()):
        blocks = block_tables[b, :-(-n // block)]
        seen = pool[blocks].reshape(-1, pool.shape[2])[:n].float()   # [S, R+P], S = n
        c, kr = seen[:, :r], seen[:, r:]
        # h head, r latent dim, p rope dim, s key position
        scores = (torch.einsum("hr,sr->hs", q_lat[b].float(), c)
                  + torch.einsum("hp,sp->hs", q_rope[b].float(), kr)) * scale
        rows.append(torch.softmax(scores, dim=-1) @ c)              # [H, R]
    o = torch.stack(rows)                                          # [B, H, R]
    return o if out is None else out.copy_(o)
