"""The interface every rollout engine implements.

The driver hands an engine token ids, never text, and gets token ids back: the context manager builds
trajectories from exactly these ids, so what is trained on is exactly what the model saw and produced.
"""

from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    max_new_tokens: int = 400
    stop: list[str] = field(default_factory=list)  # stop after the first of these strings (kept in the output)
    ignore_eos: bool = False  # keep generating past EOS up to max_new_tokens (benchmarks)
    seed: int | None = None  # seeds the engine's sampler for this call: same seed, same samples


class RolloutEngine(Protocol):
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> list[list[int]]:
        """One response per prompt: the generated ids, ending with EOS, a stop string, or at the limit."""

    def sync_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load the policy's current weights; every later `generate` samples from them."""

    def clear_cache(self) -> None:
        """Drop what the engine keeps between calls (the prefix K/V): the actor frees it before an update,
        which makes it stale anyway."""
