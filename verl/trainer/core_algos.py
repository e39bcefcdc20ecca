"""The RL math as pure tensor functions, kept in small dict registries.

Shapes: B trajectories, T tokens. Every per-token tensor is aligned with `input_ids` (B, T): position t
holds the quantity of token t (its log-prob given tokens < t, its advantage, ...). `loss_mask` is 1 exactly
on the tokens the model generated, so prompt and environment tokens never contribute to a loss.

Advantage estimators share one keyword signature:
    estimator(*, token_rewards, loss_mask, group_ids, config) -> (advantages, returns)
and live in ADV_ESTIMATORS; the trainer looks them up by `algorithm.adv_estimator` and never branches.
"""

from typing import Callable

import numpy as np
import torch

from verl.trainer.config import AlgorithmConfig


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def compute_grpo_advantages(*, token_rewards: torch.Tensor, loss_mask: torch.Tensor, group_ids: np.ndarray,
                            config: AlgorithmConfig, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: each trajectory's total reward, normalised within its group, on every generated token.

    A_i = (R_i - mean(R_group)) / (std(R_group) + eps); without std normalisation (Dr. GRPO) just the
    centred reward. std is the unbiased sample std, as in the GRPO paper's reference implementation.
    """
    scores = token_rewards.sum(dim=-1)  # (B,)
    _, group_index = np.unique(group_ids, return_inverse=True)
    group_index = torch.as_tensor(group_index, device=scores.device)  # (B,) in [0, G)
    n_groups = int(group_index.max()) + 1
    counts = torch.zeros(n_groups, device=scores.device).index_add_(0, group_index, torch.ones_like(scores))
    means = torch.zeros(n_groups, device=scores.device).index_add_(0, group_index, scores) / counts
    centred = scores - means[group_index]
    sq_sums = torch.zeros(n_groups, device=scores.device).index_add_(0, group_index, centred**2)
    stds = (sq_sums / (counts - 1).clamp(min=1)).sqrt()
    if config.norm_adv_by_std_in_grpo:
        centred = centred / (stds[group_index] + eps)
    advantages = centred[:, None] * loss_mask  # (B, T)
    return advantages, advantages.clone()


ADV_ESTIMATORS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "grpo": compute_grpo_advantages,
}


def compute_policy_loss(*, log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                        loss_mask: torch.Tensor, clip_ratio_low: float,
                        clip_ratio_high: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped PPO surrogate with decoupled clip range [1 - low, 1 + high], token-mean over `loss_mask`."""
    ratio = torch.exp(log_probs - old_log_probs)  # (B, T)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    loss = masked_mean(torch.maximum(unclipped, clipped), loss_mask)
    metrics = {
        "pg_clipfrac": masked_mean((clipped > unclipped).float(), loss_mask),
        "ppo_kl": masked_mean(old_log_probs - log_probs, loss_mask),
    }
    return loss, metrics


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position: (B, T, V) -> (B, T)."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)
