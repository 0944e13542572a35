"""Greedy batch-1 decode of Kimi-Linear as one replayable step: token -> logits -> argmax -> next
token, position += 1, the token recorded, all on the device. On CUDA the step is captured once in
a CUDA graph (§6 of the reference: graphs are what make batch-1 decode fast); elsewhere, or with
use_graph=False, the same step runs eagerly, which is how CPU tests pin it.
"""
import torch


class GreedyDecoder:
    def __init__(self, model, cache, use_graph: bool | None = None, warmup: int = 3):
        device = model.device
        self.model, self.cache = model, cache
        self.token = torch.zeros(1, dtype=torch.int64, device=device)
        self.pos = torch.zeros((), dtype=torch.int64, device=device)
        self.out = torch.zeros(cache.max_tokens + 1, dtype=torch.int64, device=device)
        self.graph = None
        if use_graph if use_graph is not None else device.type == "cuda":
            self._capture(warmup)

    def _step(self):
        logits = self.model.decode_step(self.token, self.cache, self.pos)   # [1, V]
        self.token.copy_(logits.argmax(-1))
        self.pos.add_(1)
        self.out.index_copy_(0, self.pos.view(1), self.token)             # token for position pos

    def _capture(self, warmup: int):
        """Warm up on a side stream (kernel autotuning, MLA's absorbed weights), then capture.
        Warm-up scribbles on the cache: it is reset afterwards."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step()
        self.cache.reset()

    def run(self, first_token: torch.Tensor, start: int, num_tokens: int) -> torch.Tensor:
        """Continue after a prefill of `start` positions whose greedy next token is `first_token`:
        run `num_tokens` steps -> the tokens they produce, for positions start+1.. [num_tokens]."""
        if start + num_tokens > self.cache.max_tokens:
            raise ValueError(f"{start}+{num_tokens} positions exceed the cache ({self.cache.max_tokens})")
        self.token.copy_(first_token.view(1))
        self.pos.fill_(start)
        self.out[start + 1:start + num_tokens + 1].zero_()
        for _ in range(num_tokens):
            self.graph.replay() if self.graph is not None else self._step()
        self.cache.num_tokens = start + num_tokens
        return self.out[start + 1:start + num_tokens + 1].clone()
