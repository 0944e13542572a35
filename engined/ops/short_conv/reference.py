"""Plain reference for short_conv: a causal depthwise convolution of each channel over the
window before the chunk and the chunk itself, SiLU, in fp32, rounded to x's dtype; the
window then holds the chunk's last W-1 inputs. The C channels are `parts` equal parts side
by side (KDA: q, k, v), and the output is [parts, T, C/parts], each part contiguous (fla's
chunk_kda copies q, k and v that are not).

| tensor | shape       | dtype                                                  |
|--------|-------------|--------------------------------------------------------|
| x      | [T, C]      | any float: the chunk's pre-conv inputs                 |
| weight | [C, 1, W]   | any float: each channel's W taps, oldest input first   |
| window | [C, W-1]    | the W-1 inputs before x; updated in place              |
| out    | [parts, T, C/parts] | x's dtype: SiLU(sum_j weight[c, 0, j] * input[t-W+1+j, c]) |
"""
import torch
import torch.nn.functional as F

from engined.ops import registry


def short_conv(x: torch.Tensor, weight: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """Causal depthwise conv + SiLU, fp32 accumulate. Updates `window` in place.

    x: [T, C]; weight: [C, 1, W]; window: [C, W-1] (the inputs before x) -> [T, C] in x.dtype
    """
    t, w = x.shape[0], weight.shape[-1]
    xx = torch.cat((window.float(), x.float().t()), dim=1)  # [C, W-1+T]
    taps = xx.unfold(1, w, 1)                                # [C, T, W]: inputs t-W+1..t
    y = torch.einsum("ctw,cw->tc", taps, weight[:, 0].float())
    window.copy_(xx[:, t:t + w - 1] if w > 1 else window)
    return F.silu(y).to(x.dtype)


def check_inputs(x: torch.Tensor, weight: torch.Tensor, window: torch.Tensor, parts: int):
    c = x.shape[1] if x.dim() == 2 else -1
    w = weight.shape[-1] if weight.dim() == 3 else 0
    if c < 0 or weight.shape != (c, 1, w) or window.shape != (c, w - 1) or parts < 1 or c % parts:
        raise ValueError(f"short_conv: x [T, C], weight [C, 1, W] and window [C, W-1] with C a "
                         f"multiple of parts needed, got {list(x.shape)}, {list(weight.shape)}, "
                         f"{list(window.shape)} and parts={parts}")


@registry.register("short_conv", registry.REFERENCE,
                   description="unfold and einsum in fp32, SiLU, then the parts laid out apart")
def short_conv_parts(x: torch.Tensor, weight: torch.Tensor, window: torch.Tensor, parts: int,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    check_inputs(x, weight, window, parts)
    y = short_conv(x, weight, window).view(x.shape[0], parts, -1).transpose(0, 1)
    return y.contiguous() if out is None else out.copy_(y)
