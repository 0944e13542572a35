"""Where each weight lives, planned from the GPU budget before any weight is loaded.

Kimi-Linear-48B-A3B's INT4 artifact is about 26.8 GiB, and the routed experts of its 26 MoE
layers are about 24 GiB of that, while a decode token reads only 8 of each layer's 256
experts. So the routed experts are what moves to system RAM (computed there by CPU threads)
when the GPU is too small; everything else (embeddings, KDA/MLA attention, norms, layer 0's
dense FFN, routers, shared experts, lm_head), the cache and the working buffers stay on the
GPU. A plan is all-or-nothing per MoE layer: a layer's w1/w3/w2 banks are in RAM or on the GPU.

Layers are offloaded first-to-last, as --n-cpu-moe counts them (llama.cpp's convention), so
the automatic plan is "the smallest --n-cpu-moe that fits" and can be written back as a flag.
What the budget leaves then goes, by default, to a cache of the offloaded layers' hot experts
on the GPU (--moe-cache; layers/expert_cache.py), in whole experts.
"""
from dataclasses import dataclass

from engined.config import MOE_CACHE_AUTO, format_size

GiB, MiB = 1024**3, 1024**2

# The CUDA context and what is loaded into it after start: the context proper (~300-500 MiB
# on Hopper, depending on the driver and how many kernel modules lazy loading pulls in), the
# cuBLAS handle and its workspace, and the Triton kernels' modules. Charged to every GPU plan.
CUDA_CONTEXT_BYTES = 768 * MiB
# Working buffers beside the weights and the cache: the activations of one prefill chunk
# (a [T, D] hidden state is small; the MoE's [T*k, I] intermediates and the [T, V] fp32
# logits are not), the CUDA graph pools of the decode buckets, the caching allocator's
# rounding, and the latent pool's rounding blocks (< 1 MB per sequence). A prefill chunk's
# attention over the whole context comes on top (ModelParts.workspace_bytes).
WORKSPACE_BYTES = 1 * GiB
# What the default budget leaves free on the device: other processes' growth, the display,
# and fragmentation the allocator cannot give back.
DEFAULT_MARGIN_BYTES = 1 * GiB


class PlacementError(ValueError):
    """A plan that cannot be met (or a placement flag out of range); the message has the numbers."""


@dataclass(frozen=True)
class ModelParts:
    """A model's bytes by where they may live, from a model built on the meta device."""
    attention: int          # every weight that is not a MoE layer's routed or shared experts
    shared_experts: int
    routed: tuple[tuple[int, int], ...]  # (layer index, routed-expert bytes), in layer order
    state_bytes_per_sequence: int        # KDA state (conv windows + S) of one sequence
    kv_bytes_per_token: int              # MLA latent + rope of one token, every MLA layer
    routed_int4: bool = True             # the routed experts are packed INT4 (RAM needs that)
    num_experts: int = 0                 # routed experts per MoE layer
    prefill_bytes_per_token: int = 0     # a prefill chunk's transient per token of context

    @property
    def expert_bytes(self) -> int:
        """One routed expert's w1, w3 and w2: an expert cache slot."""
        return self.routed[0][1] // self.num_experts if self.num_experts else 0

    @property
    def num_moe_layers(self) -> int:
        return len(self.routed)

    @property
    def routed_bytes(self) -> int:
        return sum(nbytes for _, nbytes in self.routed)

    def cache_bytes(self, max_context: int, max_batch: int) -> int:
        """The latent rows of max_context tokens and a KDA state slot per running sequence,
        plus the scratch slot that padded decode rows write."""
        return self.kv_bytes_per_token * max_context + self.state_bytes_per_sequence * (max_batch + 1)

    def workspace_bytes(self, max_context: int) -> int:
        """WORKSPACE_BYTES, and what a prefill chunk's attention holds over a context of
        max_context tokens (MLA: the latents gathered, expanded into keys and values: 42,112
        bytes a token for Kimi-Linear in bf16, 1.3 GiB at 32k, 5.1 GiB at 128k)."""
        return WORKSPACE_BYTES + self.prefill_bytes_per_token * max_context


def model_parts(model) -> ModelParts:
    """A KimiLinearModel (on any device, meta included) -> its ModelParts. `attention` is what
    remains of model.weight_bytes once the experts are taken out, so the parts add up exactly."""
    shared, routed, int4, num_experts = 0, [], True, 0
    for i, layer in enumerate(model.layers):
        moe = layer.moe
        if moe is None:
            continue
        routed.append((i, moe.w1.nbytes + moe.w3.nbytes + moe.w2.nbytes))
        int4 = int4 and moe.w1.group_size is not None
        num_experts = moe.gate.shape[0]
        if moe.shared_experts is not None:
            shared += _swiglu_bytes(moe.shared_experts)
    attention = model.weight_bytes - shared - sum(nbytes for _, nbytes in routed)
    if attention <= 0:
        raise PlacementError(f"the experts ({format_size(model.weight_bytes - attention)}) come to "
                             f"more than the model's {format_size(model.weight_bytes)} of weights")
    return ModelParts(attention, shared, tuple(routed), model.state_bytes, model.kv_bytes_per_token,
                      int4, num_experts, model.prefill_bytes_per_token)


def _swiglu_bytes(mlp) -> int:
    """The SwiGLU's tensors, each once, counted as model.weight_bytes counts them (imported
    here so that planning from ModelParts does not load the model code)."""
    from engined.models.kimi_linear import weight_tensors
    return sum(t.nbytes for t in weight_tensors(mlp))


def default_gpu_budget(free_bytes: int) -> int:
    """The budget when --gpu-memory is 0: the device's free memory less DEFAULT_MARGIN_BYTES."""
    return max(0, int(free_bytes) - DEFAULT_MARGIN_BYTES)


@dataclass(frozen=True)
class Placement:
    device: str                  # "cuda" or "cpu"
    offloaded: frozenset[int]    # layer indices whose routed experts are in RAM
    gpu: dict[str, int]          # part -> bytes on the GPU (empty on cpu)
    ram: dict[str, int]          # part -> bytes in RAM
    gpu_budget: int              # 0 on cpu
    reason: str                  # why this placement: the flag, the budget, or the device
    num_moe_layers: int = 0
    cache_slots: int = 0         # experts the GPU caches for the offloaded layers

    @property
    def gpu_total(self) -> int:
        return sum(self.gpu.values())

    @property
    def ram_total(self) -> int:
        return sum(self.ram.values())

    def is_offloaded(self, layer: int) -> bool:
        return layer in self.offloaded

    def describe(self) -> list[str]:
        """A table for the start-up log and `kimi-engine doctor`: a line per part, the totals,
        and which MoE layers' routed experts are in RAM."""
        parts = list(dict.fromkeys([*self.gpu, *self.ram]))
        width = max(len(p) for p in (*parts, "total"))

        def row(name: str, on_gpu: str, in_ram: str) -> str:
            return f"  {name:<{width}}  {on_gpu:>10}  {in_ram:>10}"
        lines = [f"placement on {self.device} ({self.reason}):", row("", "GPU", "RAM")]
        lines += [row(p, format_size(self.gpu.get(p, 0)), format_size(self.ram.get(p, 0))) for p in parts]
        lines.append(row("total", format_size(self.gpu_total), format_size(self.ram_total)))
        if self.device == "cuda":
            lines.append(f"  GPU budget {format_size(self.gpu_budget)}, "
                         f"{format_size(self.gpu_budget - self.gpu_total)} of it unplanned")
        where = f" (layers {_ranges(sorted(self.offloaded))})" if self.offloaded else ""
        lines.append(f"  routed experts of {len(self.offloaded)} of {self.num_moe_layers} "
                     f"MoE layers in RAM{where}")
        if self.device == "cuda" and self.offloaded:
            size = self.gpu.get("expert cache", 0)
            lines.append(f"  expert cache: {self.cache_slots} experts, {format_size(size)} "
                         "(--moe-cache)" if self.cache_slots else "  expert cache: off")
        return lines


def _ranges(layers: list[int]) -> str:
    """[1, 2, 3, 7] -> '1..3, 7'."""
    runs: list[list[int]] = []
    for i in layers:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"{a}..{b}" if b > a else f"{a}" for a, b in runs)


def plan_placement(parts: ModelParts, device: str, max_context: int, max_batch: int,
                   gpu_budget: int = 0, cpu_moe: bool = False, n_cpu_moe: int = 0,
                   moe_cache: int = 0, prefix_cache: int = 0) -> Placement:
    """Where every part lives. cuda: explicit --cpu-moe (all MoE layers) or --n-cpu-moe N (the
    first N) is checked against gpu_budget; without them, the fewest first layers are offloaded
    that let the GPU part fit. cpu_moe wins over n_cpu_moe when both are given. cpu: every byte
    is in RAM; an explicit flag still sets `offloaded` (the hybrid path then runs with CPU on
    both sides; BF16 experts have no hybrid step, so there it changes nothing), and the budget
    plays no part. Raises PlacementError with the numbers, and for BF16 routed experts that
    must leave the GPU, with the quantize command (before anything is loaded). moe_cache:
    bytes of expert cache for the offloaded layers on cuda (MOE_CACHE_AUTO: what the budget
    leaves; 0: none), refused when it does not fit. prefix_cache: --prefix-cache-bytes, which
    the cache fills with rows and states on the model's device (on cuda, part of the budget)."""
    num = parts.num_moe_layers
    if n_cpu_moe < 0 or n_cpu_moe > num:
        raise PlacementError(f"--n-cpu-moe {n_cpu_moe}: this model has {num} MoE layers, "
                             f"so it must be 0..{num}")
    explicit = num if cpu_moe else n_cpu_moe if n_cpu_moe else None
    flag = "--cpu-moe" if cpu_moe else f"--n-cpu-moe {n_cpu_moe}"
    cache = parts.cache_bytes(max_context, max_batch)
    if device == "cpu":
        count = (explicit or 0) if parts.routed_int4 else 0
        return _on_cpu(parts, cache, count, flag if explicit is not None else "")
    if device != "cuda" and not device.startswith("cuda:"):
        raise PlacementError(f"device {device!r}: placement plans for 'cuda' or 'cpu'")
    if gpu_budget <= 0:
        raise PlacementError(f"a GPU budget of {format_size(gpu_budget)}: the caller passes "
                             "--gpu-memory, or default_gpu_budget(free memory)")
    return _on_cuda(parts, cache, parts.workspace_bytes(max_context), gpu_budget, explicit, flag,
                    moe_cache, prefix_cache)


def _on_cuda(parts: ModelParts, cache: int, workspace: int, gpu_budget: int,
             explicit: int | None, flag: str, moe_cache: int = 0,
             prefix_cache: int = 0) -> Placement:
    """explicit: the number of first MoE layers a flag put in RAM, or None to plan."""
    beside = {"cache": cache, **({"prefix cache": prefix_cache} if prefix_cache else {}),
              "workspace": workspace, "CUDA context": CUDA_CONTEXT_BYTES}  # not weights
    fixed = {"attention": parts.attention, "shared experts": parts.shared_experts, **beside}
    need = sum(fixed.values())  # what the GPU holds with every routed expert in RAM
    if need > gpu_budget:
        raise PlacementError(
            f"even with every routed expert in RAM the GPU needs {format_size(need)} of the "
            f"{format_size(gpu_budget)} budget ({_itemize(fixed)}): lower --max-context or "
            "--max-batch, or raise --gpu-memory")
    fits = smallest_offload(parts, gpu_budget - need)
    if explicit is not None and explicit < fits:
        over = need + _routed_from(parts, explicit)
        raise PlacementError(
            f"{flag} leaves {format_size(over)} on the GPU, over the {format_size(gpu_budget)} "
            f"budget: the fewest layers that fit is --n-cpu-moe {fits} (or leave the placement "
            "to the planner)")
    count = fits if explicit is None else explicit
    reason = flag if explicit is not None else f"planned for a {format_size(gpu_budget)} GPU budget"
    if count and not parts.routed_int4:
        raise PlacementError(
            f"{reason}: the routed experts of {count} MoE layers must live in RAM, and routed "
            "experts in RAM need the INT4 artifact; this checkpoint's are BF16. Run `kimi-engine "
            "quantize CHECKPOINT ARTIFACT` (or `kimi-engine pull ORG/REPO`) and serve the "
            f"artifact, or give the GPU {format_size(need + parts.routed_bytes)} to hold every expert")
    offloaded = frozenset(i for i, _ in parts.routed[:count])
    on_gpu = _routed_from(parts, count)
    gpu = {"attention": parts.attention, "shared experts": parts.shared_experts,
           "routed experts": on_gpu, **beside}
    slots = cache_slots(parts, count, gpu_budget - sum(gpu.values()), moe_cache)
    if slots:
        gpu["expert cache"] = slots * parts.expert_bytes
    return Placement("cuda", offloaded, gpu, {"routed experts": parts.routed_bytes - on_gpu},
                     gpu_budget, reason, parts.num_moe_layers, slots)


def cache_slots(parts: ModelParts, count: int, room: int, moe_cache: int) -> int:
    """Experts the GPU caches for the first `count` MoE layers in RAM, in the `room` the plan
    leaves: --moe-cache SIZE in whole experts (refused past the room), or auto: as many as
    fit; never more than the offloaded layers' experts."""
    per = parts.expert_bytes
    if not count or not moe_cache or not per:
        return 0
    most = count * parts.num_experts
    if moe_cache == MOE_CACHE_AUTO:
        return min(max(room, 0) // per, most)
    slots = min(moe_cache // per, most)
    if slots * per > room:
        raise PlacementError(
            f"--moe-cache {format_size(moe_cache)} does not fit: {slots} experts of "
            f"{format_size(per)} need {format_size(slots * per)}, and the plan leaves "
            f"{format_size(max(room, 0))} of the GPU budget: lower --moe-cache (or auto), or "
            "raise --gpu-memory")
    return slots


def smallest_offload(parts: ModelParts, room: int) -> int:
    """The fewest first MoE layers whose routed experts must leave the GPU so that the rest
    take at most `room` bytes."""
    for count in range(parts.num_moe_layers + 1):
        if _routed_from(parts, count) <= room:
            return count
    raise PlacementError(f"no placement fits in {format_size(room)}")  # room < 0: caller's bug


def _routed_from(parts: ModelParts, count: int) -> int:
    """Routed-expert bytes of the MoE layers after the first `count` (those left on the GPU)."""
    return sum(nbytes for _, nbytes in parts.routed[count:])


def _itemize(sizes: dict[str, int]) -> str:
    return ", ".join(f"{name} {format_size(n)}" for name, n in sizes.items())


def _on_cpu(parts: ModelParts, cache: int, count: int, flag: str) -> Placement:
    ram = {"attention": parts.attention, "shared experts": parts.shared_experts,
           "routed experts": parts.routed_bytes, "cache": cache}
    reason = ("--device cpu" if not flag else
              f"--device cpu, {flag}: the hybrid path, CPU on both sides" if count else
              f"--device cpu, {flag}: BF16 routed experts, already in RAM; nothing changes")
    return Placement("cpu", frozenset(i for i, _ in parts.routed[:count]), {}, ram, 0, reason,
                     parts.num_moe_layers)
