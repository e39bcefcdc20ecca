"""The interface every rollout engine implements.

The driver hands an engine token ids, never text, and gets token ids back: the context manager builds
trajectories from exactly these ids, so what is trained on is exactly what the model saw and produced.
With each id comes its log-prob under the policy the trainer optimises, so that the trainer can measure
(and, with truncated importance sampling, correct) how far its own log-probs are from the engine's.
"""

from dataclasses import dataclass, field
from typing import Protocol

import torch

from verl.utils.fingerprint import Fingerprint


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    max_new_tokens: int = 400
    stop: list[str] = field(default_factory=list)  # stop after the first of these strings (kept in the output)
    ignore_eos: bool = False  # keep generating past EOS up to max_new_tokens (benchmarks)
    seed: int | None = None  # seeds the engine's sampler for this call: same seed, same samples


@dataclass
class Generation:
    """What `generate` returns, one entry per prompt: the generated ids, and the log-prob of each under the
    policy the trainer uses, log_softmax(logits / temperature) at the sampled token (temperature 1 for greedy
    decoding). They are not renormalised over the top-k / top-p set the token was drawn from: the trainer's
    policy has no such cut, and these log-probs are compared with the trainer's."""

    token_ids: list[list[int]]
    log_probs: list[list[float]]  # log_probs[i][j] belongs to token_ids[i][j]


def sampled_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax(logits / temperature) at `tokens`, in fp32: logits (..., V), tokens (...) -> (...).
    Temperature 0 (greedy) scores at 1, as the trainer would."""
    scores = logits.float() / (temperature or 1.0)
    return scores.gather(-1, tokens[..., None].to(scores.device)).squeeze(-1) - scores.logsumexp(-1)


class RolloutEngine(Protocol):
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> Generation:
        """One response per prompt: the generated ids, ending with EOS, a stop string, or at the limit, and
        their log-probs (`Generation`)."""

    def sync_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load the policy's current weights; every later `generate` samples from them."""

    def clear_cache(self) -> None:
        """Drop what the engine keeps between calls (the prefix K/V): the actor frees it before an update,
        which makes it stale anyway."""

    def weight_fingerprint(self) -> dict[str, Fingerprint]:
        """Fingerprints of the weights the live model computes with, under the Hugging Face names
        (verl/utils/fingerprint.py): the actor compares them with its own after every `sync_weights`."""
