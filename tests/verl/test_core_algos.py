import math

import numpy as np
import pytest
import torch

from verl.trainer.config import AlgorithmConfig
from verl.trainer.core_algos import (ADV_ESTIMATORS, compute_grpo_advantages, compute_policy_loss,
                                     entropy_from_logits, masked_mean)


def test_grpo_matches_hand_computed_values():
    # Two groups of two. Group 0 rewards 1 and 3 (mean 2, sample std sqrt(2)); group 1 rewards 5, 5.
    token_rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 3.0], [5.0, 0.0, 0.0], [0.0, 5.0, 0.0]])
    loss_mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    advantages, returns = compute_grpo_advantages(token_rewards=token_rewards, loss_mask=loss_mask,
                                                  group_ids=np.array([7, 7, 2, 2]), config=AlgorithmConfig())
    a = 1 / math.sqrt(2)
    expected = torch.tensor([[0, -a, -a], [0, a, a], [0, 0, 0], [0, 0, 0]])
    assert torch.allclose(advantages, expected, atol=1e-5)
    assert torch.equal(advantages, returns)


def test_grpo_without_std_only_centres():
    advantages, _ = compute_grpo_advantages(
        token_rewards=torch.tensor([[1.0], [3.0]]), loss_mask=torch.ones(2, 1), group_ids=np.array([0, 0]),
        config=AlgorithmConfig(norm_adv_by_std_in_grpo=False))
    assert advantages.flatten().tolist() == [-1.0, 1.0]


def test_grpo_vectorised_equals_loop_reference():
    torch.manual_seed(0)
    rewards = torch.randn(12, 5)
    mask = (torch.rand(12, 5) > 0.3).float()
    groups = np.array([0, 1, 2] * 4)
    advantages, _ = compute_grpo_advantages(token_rewards=rewards, loss_mask=mask, group_ids=groups,
                                            config=AlgorithmConfig())
    scores = rewards.sum(-1)
    for i in range(12):
        members = scores[torch.as_tensor(groups == groups[i])]
        expected = (scores[i] - members.mean()) / (members.std() + 1e-6)
        assert torch.allclose(advantages[i], expected * mask[i], atol=1e-5)


def test_registry_holds_grpo():
    assert ADV_ESTIMATORS["grpo"] is compute_grpo_advantages


def test_policy_loss_hand_computed_with_decoupled_clip():
    # Three tokens: ratio 1.5 with A=+1 (clipped at 1.28), ratio 0.5 with A=-1 (clipped at 0.8), ratio 1 with A=2.
    log_probs = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))
    old_log_probs = torch.zeros(1, 3)
    advantages = torch.tensor([[1.0, -1.0, 2.0]])
    loss, metrics = compute_policy_loss(log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages,
                                        loss_mask=torch.ones(1, 3), clip_ratio_low=0.2, clip_ratio_high=0.28)
    # per token: max(-A r, -A clip(r)) = max(-1.5, -1.28) = -1.28; max(0.5, 0.8) = 0.8; max(-2, -2) = -2
    assert loss.item() == pytest.approx((-1.28 + 0.8 - 2.0) / 3, abs=1e-6)
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 3)


def test_policy_loss_ignores_masked_tokens_and_its_gradient_raises_good_tokens():
    log_probs = torch.zeros(1, 3, requires_grad=True)
    advantages = torch.tensor([[1.0, -1.0, 100.0]])
    loss, _ = compute_policy_loss(log_probs=log_probs, old_log_probs=torch.zeros(1, 3), advantages=advantages,
                                  loss_mask=torch.tensor([[1.0, 1.0, 0.0]]), clip_ratio_low=0.2, clip_ratio_high=0.2)
    loss.backward()
    # descending the loss raises the log-prob of the positive-advantage token, lowers the negative one
    assert log_probs.grad[0, 0] < 0 < log_probs.grad[0, 1]
    assert log_probs.grad[0, 2] == 0


def test_entropy_of_uniform_is_log_vocab():
    assert torch.allclose(entropy_from_logits(torch.zeros(2, 3, 10)), torch.full((2, 3), math.log(10)))


def test_masked_mean_empty_mask_is_zero():
    assert masked_mean(torch.ones(3), torch.zeros(3)).item() == 0.0
