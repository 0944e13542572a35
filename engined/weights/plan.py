"""What loading yields: a memory plan from headers alone, and a loaded model with its
tokenizer and chat format. Both model families' loaders return these."""
import pathlib
from dataclasses import dataclass
from typing import Any

from engined.models.protocol import Model


@dataclass(frozen=True)
class LoadPlan:
    weight_bytes: int
    kv_bytes_per_token: int
    context_length: int
    parts: Any = None  # weights/placement.ModelParts of a MoE model (where experts may go)

    def total_bytes(self, max_context: int) -> int:
        return self.weight_bytes + self.kv_bytes_per_token * max_context


@dataclass
class LoadedModel:
    model_id: str
    model: Model
    tokenizer: Any
    chat: Any
    context_length: int
    source: pathlib.Path
    offload_counters: Any = None  # layers/moe_offload.OffloadCounters with experts in RAM
