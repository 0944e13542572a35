"""How many tensors a piece of host code builds from Python values (torch.tensor: aten's
lift_fresh) and copies into other tensors (copy_, _to_copy). On a GPU each list made into a
tensor on the device is its own host-to-device copy, some microseconds of the step's
critical path, so the decode step and the sampler are held to a fixed count on the CPU."""
import collections

from torch.utils._python_dispatch import TorchDispatchMode

COUNTED = {"lift_fresh", "copy_", "_to_copy"}


class _Count(TorchDispatchMode):
    def __init__(self, counts: collections.Counter):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in COUNTED:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


def host_copies(run) -> collections.Counter:
    """run() -> {"lift_fresh": tensors made from Python values, "copy_"/"_to_copy": copies}."""
    counts = collections.Counter()
    with _Count(counts):
        run()
    return counts
