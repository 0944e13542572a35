"""Kimi-Linear's decode step with routed experts in RAM, in pieces a CUDA graph can hold
(engine/runner.py captures each segment; models/kimi_graph_step.py drives them).

Segment k runs on the device: (k > 0) the routed output of offloaded layer k-1 back from
pinned host rows plus its shared expert's output, then the layers up to offloaded layer k,
whose attention, norm and router run and whose hidden rows and top-k go out to the pinned
rows; the last segment runs the remaining layers and the LM head. Between segments the
crossing queues the shared expert (its own graph, run while the CPU computes), waits for
the copies out, and runs moe_grouped on the CPU threads; with an expert cache it first
splits the routes and queues the cached experts' graph (reading the split from pinned rows). Every tensor a segment hands to
the next is an attribute of the step, so a replay refills the tensors the next one reads.
With the CPU as the device the same pieces run eagerly: the hybrid step's ops in its order,
so the tokens are the plain model's bit for bit (tests/models/test_kimi_piecewise.py).
"""
from functools import partial

import torch

from engined.layers.moe_offload import HostBuffers
from engined.models.kimi_graph_step import Crossing, KimiGraphStep


class KimiPiecewiseStep(KimiGraphStep):
    def __init__(self, model, rows: int, max_blocks: int):
        super().__init__(model, rows, max_blocks)
        c, self.offloaded = model.config, model.offloaded
        n = len(self.offloaded)
        # rows of this bucket, never grown: a graph reads and writes these very addresses
        self.host = HostBuffers(c.hidden_size, c.num_experts_per_token, model.device,
                                for_graphs=True).take(rows)
        self.h = self.step_rows = None         # the residual stream [B, D]; rows with lengths
        self.f: list[torch.Tensor | None] = [None] * n           # offloaded layer k's FFN input
        self.shared_out: list[torch.Tensor | None] = [None] * n  # its shared expert's output
        self.cached_out: list[torch.Tensor | None] = [None] * n  # its cached experts' output
        self.segments = [partial(self._segment, k) for k in range(n + 1)]
        cached = model.expert_cache is not None
        self.crossings = [Crossing(partial(self._overlap, k) if self._moe(k).shared_experts else None,
                                   partial(self._compute, k),
                                   partial(self._decide, k) if cached else None,
                                   partial(self._cached, k) if cached else None) for k in range(n)]

    def _moe(self, k: int):
        return self.model.layers[self.offloaded[k]].block_sparse_moe

    @torch.inference_mode()
    def _segment(self, k: int):
        m, n = self.model, len(self.offloaded)
        if k == 0:
            self.h, self.step_rows = m.decode_embed(self.tokens, self.inputs)
            delta, first = None, 0
        else:
            moe = self._moe(k - 1)
            delta = moe.host_experts.receive(self.host, self.shared_out[k - 1], self.f[k - 1].dtype,
                                             self.cached_out[k - 1])
            first = self.offloaded[k - 1] + 1
        end = self.offloaded[k] if k < n else len(m.layers)
        delta = m.decode_layers(self.h, delta, self.step_rows, first, end)
        if k == n:
            self.logits = m.decode_head(self.h, delta)
            return
        pools = (m.state_pool, m.latent_pool)
        self.f[k] = m.layers[end].decode_attention(self.h, delta, end, pools, self.step_rows)
        moe = self._moe(k)
        experts, weights = moe.route_rows(self.f[k])
        moe.host_experts.send(self.f[k], experts, weights, self.host)

    @torch.inference_mode()
    def _overlap(self, k: int):
        self.shared_out[k] = self._moe(k).shared_experts(self.f[k])

    def _decide(self, k: int):
        self._moe(k).host_experts.decide(self.host, self.live)

    @torch.inference_mode()
    def _cached(self, k: int):
        self.cached_out[k] = self._moe(k).host_experts.run_cached(self.f[k], self.host)

    def _compute(self, k: int):
        moe = self._moe(k)
        moe.host_experts.compute(self.host, (moe.w1, moe.w3, moe.w2), self.live)
