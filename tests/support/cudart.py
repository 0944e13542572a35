"""torch.cuda.cudart() for host registration on a machine without CUDA."""


class FakeCudart:
    """What is page-locked (cudaHostRegister'd) now, by address; registering one twice fails,
    as the driver's cudaErrorHostMemoryAlreadyRegistered (712)."""

    def __init__(self):
        self.locked: set[int] = set()

    def cudaHostRegister(self, ptr, size, flags):
        if ptr in self.locked:
            return 712
        self.locked.add(ptr)
        return 0

    def cudaHostUnregister(self, ptr):
        self.locked.discard(ptr)
        return 0
