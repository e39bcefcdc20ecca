"""Tests of verl/trainer/core_algos.py, the RL math.

Every advantage estimator is checked against a slow loop reference written below, the way the docstrings of
core_algos state it: per trajectory, the tokens its mask selects compacted into a list, the recursion run
over that list, the results scattered back to (B, T). Hand-computed two-turn cases pin the conventions
(environment tokens skipped, rewards on turn ends, anchor states), then come masks, losses, KL, reward
normalisation and the rollout filter (StarPO-S, RAGEN-2's strategies).
"""

import math
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch

from verl.trainer.config import AlgorithmConfig
from verl.trainer.core_algos import (ADV_ESTIMATORS, ADV_MASKS, FILTER_METRICS, KL_CONTROLLERS, KL_PENALTIES,
                                     LOSS_AGG_MODES,
                                     AdaptiveKLController, agg_loss, apply_kl_penalty, balanced_order,
                                     compute_policy_loss,
                                     compute_value_loss, entropy_from_log_probs, explained_variance, masked_mean,
                                     normalize_scores, rollout_mismatch, select_groups, span_mask,
                                     truncated_is_weights, turn_end_mask)

EPS = 1e-6  # the guard core_algos adds to a group's std
WHITEN_EPS = 1e-8  # the guard masked_whiten adds to the variance


# ---- batches ------------------------------------------------------------------------------------
@dataclass
class Batch:
    loss_mask: torch.Tensor  # (B, T) float, 1 on generated tokens
    turn_ends: torch.Tensor  # (B, T) bool, each reply's last token, as the builder laid it out
    token_rewards: torch.Tensor  # (B, T), non-zero only on turn ends
    values: torch.Tensor  # (B, T), random everywhere so that reading a masked position shows
    group_ids: np.ndarray  # (B,)
    state_ids: torch.Tensor  # (B, T) long: the state each token's turn answered, -1 on padding

    def estimate(self, name: str, config: AlgorithmConfig, adv_mask: torch.Tensor | None = None):
        return ADV_ESTIMATORS[name].fn(
            token_rewards=self.token_rewards, values=self.values,
            adv_mask=self.loss_mask if adv_mask is None else adv_mask, turn_ends=self.turn_ends,
            group_ids=self.group_ids, state_ids=self.state_ids, config=config)


def random_batch(seed: int, batch_size: int = 6, width: int = 30, group_size: int = 3) -> Batch:
    """Trajectories of 1 to 3 turns, right-padded to `width`. A turn is a state span (the prompt, or the
    environment's reply; mask 0) then a generated span (mask 1) whose last token holds the turn's reward.
    Each turn answers a state drawn from {0, 1, 2}, so anchor states repeat within a group. Groups are
    interleaved (ids 10, 20, 10, 20, ...) so that nothing may assume contiguous groups."""
    gen = torch.Generator().manual_seed(seed)

    def randint(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=gen))

    loss_mask = torch.zeros(batch_size, width)  # (B, T)
    turn_ends = torch.zeros(batch_size, width, dtype=torch.bool)  # (B, T)
    token_rewards = torch.zeros(batch_size, width)  # (B, T)
    state_ids = torch.full((batch_size, width), -1, dtype=torch.long)  # (B, T)
    for i in range(batch_size):
        start = 0
        for turn in range(randint(1, 3)):  # at most 4 + 4 + 2 * (3 + 4) = 22 <= width tokens
            reply_start = start + (randint(2, 4) if turn == 0 else randint(1, 3))
            end = reply_start + randint(1, 4) - 1
            state_ids[i, start:end + 1] = randint(0, 2)
            loss_mask[i, reply_start:end + 1] = 1
            turn_ends[i, end] = True
            token_rewards[i, end] = torch.randn((), generator=gen)
            start = end + 1
    values = torch.randn(batch_size, width, generator=gen)  # (B, T)
    group_ids = np.tile(10 * np.arange(1, batch_size // group_size + 1), group_size)  # (B,)
    return Batch(loss_mask, turn_ends, token_rewards, values, group_ids, state_ids)


TWO_TURN_MASK = [0, 1, 1, 0, 0, 1, 1]  # [prompt, gen, gen, env, env, gen, gen]: turns end at tokens 2 and 6


def two_turn_batch(turn_rewards, values=None, group_ids=None, turn_states=None) -> Batch:
    """One row of the layout TWO_TURN_MASK per row of `turn_rewards` (B, 2), rewards on tokens 2 and 6.
    `turn_states` (B, 2): the state each turn answered (tokens 0-2 answer the first, tokens 3-6 the second)."""
    batch_size = len(turn_rewards)
    turn_rewards = torch.tensor(turn_rewards, dtype=torch.float32)  # (B, 2)
    loss_mask = torch.tensor([TWO_TURN_MASK] * batch_size, dtype=torch.float32)  # (B, 7)
    turn_ends = torch.zeros(batch_size, 7, dtype=torch.bool)  # (B, 7)
    turn_ends[:, [2, 6]] = True
    token_rewards = torch.zeros(batch_size, 7)  # (B, 7)
    token_rewards[:, [2, 6]] = turn_rewards
    turn_states = torch.tensor(turn_states if turn_states is not None else [[0, 1]] * batch_size)  # (B, 2)
    state_ids = turn_states[:, [0, 0, 0, 1, 1, 1, 1]]  # (B, 7)
    values = torch.zeros(batch_size, 7) if values is None else torch.tensor(values, dtype=torch.float32)
    group_ids = np.zeros(batch_size, dtype=int) if group_ids is None else np.array(group_ids)
    return Batch(loss_mask, turn_ends, token_rewards, values, group_ids, state_ids)


def on_tokens(per_turn) -> torch.Tensor:
    """Rows of (turn 1's value, turn 2's value) spread over the TWO_TURN_MASK layout: (B, 2) -> (B, 7)."""
    return torch.tensor([[0, a, a, 0, 0, b, b] for a, b in per_turn], dtype=torch.float64)


def assert_close(actual: torch.Tensor, expected, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual.double(), torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=1e-5)


# ---- loop references -----------------------------------------------------------------------------
def gae_over(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """Textbook GAE over one list of steps; after the last step V = A = 0."""
    advantages, next_value, next_advantage = [0.0] * len(rewards), 0.0, 0.0
    for k in reversed(range(len(rewards))):
        delta = rewards[k] + gamma * next_value - values[k]
        next_advantage = advantages[k] = delta + gamma * lam * next_advantage
        next_value = values[k]
    return advantages


def mean_std(xs: list[float]) -> tuple[float, float]:
    """Mean and unbiased std; std 0 for a single value."""
    mean = sum(xs) / len(xs)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0


def whiten_reference(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    positions = mask.nonzero().tolist()
    mean, std = mean_std([float(x[i, t]) for i, t in positions])
    out = torch.zeros_like(x)
    for i, t in positions:
        out[i, t] = (float(x[i, t]) - mean) / math.sqrt(std**2 + WHITEN_EPS)
    return out


def steps(mask: torch.Tensor, i: int) -> list[int]:
    return [t for t in range(mask.shape[1]) if mask[i, t]]


def turns(batch: Batch, mask: torch.Tensor, i: int) -> list[list[int]]:
    """The masked positions of each turn of trajectory i; turn k's list ends with its turn end."""
    result, current = [], []
    for t in range(mask.shape[1]):
        if mask[i, t]:
            current.append(t)
        if batch.turn_ends[i, t]:
            result.append(current)
            current = []
    return result


def score(batch: Batch, i: int) -> float:
    return float(batch.token_rewards[i].sum())


def group_scores(batch: Batch, i: int) -> list[float]:
    return [score(batch, j) for j in range(len(batch.group_ids)) if batch.group_ids[j] == batch.group_ids[i]]


def gae_reference(batch: Batch, config: AlgorithmConfig, mask: torch.Tensor):
    advantages, returns = torch.zeros(mask.shape, dtype=torch.float64), torch.zeros(mask.shape, dtype=torch.float64)
    for i in range(mask.shape[0]):
        ts = steps(mask, i)
        rewards, values = [float(batch.token_rewards[i, t]) for t in ts], [float(batch.values[i, t]) for t in ts]
        for t, a, v in zip(ts, gae_over(rewards, values, config.gamma, config.lam), values):
            advantages[i, t], returns[i, t] = a, a + v
    return (whiten_reference(advantages, mask) if config.whiten_advantages else advantages), returns


def bi_level_gae_reference(batch: Batch, config: AlgorithmConfig, mask: torch.Tensor):
    advantages, returns = torch.zeros(mask.shape, dtype=torch.float64), torch.zeros(mask.shape, dtype=torch.float64)
    for i in range(mask.shape[0]):
        turn_list = turns(batch, mask, i)
        ends = [turn[-1] for turn in turn_list]
        end_values = [float(batch.values[i, e]) for e in ends]
        turn_advantages = gae_over([float(batch.token_rewards[i, e]) for e in ends], end_values,
                                   config.high_level_gamma, config.lam)
        for turn, turn_advantage, end_value in zip(turn_list, turn_advantages, end_values):
            # within the turn: its own rewards, except that its last token earns the turn's return G_k
            rewards = [float(batch.token_rewards[i, t]) for t in turn[:-1]] + [turn_advantage + end_value]
            values = [float(batch.values[i, t]) for t in turn]
            for t, a, v in zip(turn, gae_over(rewards, values, config.gamma, config.lam), values):
                advantages[i, t], returns[i, t] = a, a + v
    return (whiten_reference(advantages, mask) if config.whiten_advantages else advantages), returns


def grpo_reference(batch: Batch, config: AlgorithmConfig, mask: torch.Tensor):
    advantages = torch.zeros(mask.shape, dtype=torch.float64)
    for i in range(mask.shape[0]):
        mean, std = mean_std(group_scores(batch, i))
        advantage = score(batch, i) - mean
        if config.norm_adv_by_std_in_grpo:
            advantage /= std + EPS
        advantages[i] = advantage * mask[i]
    return advantages, advantages


def rloo_reference(batch: Batch, config: AlgorithmConfig, mask: torch.Tensor):
    advantages = torch.zeros(mask.shape, dtype=torch.float64)
    for i in range(mask.shape[0]):
        others = group_scores(batch, i)
        others.remove(score(batch, i))
        advantages[i] = (score(batch, i) - sum(others) / len(others) if others else 0.0) * mask[i]
    return advantages, advantages


def reinforce_reference(batch: Batch, config: AlgorithmConfig, mask: torch.Tensor):
    advantages = torch.stack([score(batch, i) * mask[i].double() for i in range(mask.shape[0])])
    return advantages, advantages


def reinforce_plus_plus_reference(batch: Batch, config: AlgorithmConfig, mask: torch.Tensor):
    returns = torch.zeros(mask.shape, dtype=torch.float64)
    for i in range(mask.shape[0]):
        reward_to_go = 0.0
        for t in reversed(steps(mask, i)):
            reward_to_go = returns[i, t] = float(batch.token_rewards[i, t]) + config.gamma * reward_to_go
    return whiten_reference(returns, mask), returns


def gigpo_reference(batch: Batch, config: AlgorithmConfig, mask: torch.Tensor):
    advantages, _ = grpo_reference(batch, config, mask)  # the episode level
    turn_list = []  # (trajectory, masked positions of the turn, discounted return R_k, anchor (group, state))
    anchor_returns = defaultdict(list)  # anchor -> the R_k of every turn that answered it
    for i in range(mask.shape[0]):
        reward_to_go = 0.0
        for turn in reversed(turns(batch, mask, i)):
            end = turn[-1]
            reward_to_go = float(batch.token_rewards[i, end]) + config.high_level_gamma * reward_to_go
            anchor = (batch.group_ids[i], int(batch.state_ids[i, end]))
            turn_list.append((i, turn, reward_to_go, anchor))
            anchor_returns[anchor].append(reward_to_go)
    for i, turn, reward_to_go, anchor in turn_list:
        mean, std = mean_std(anchor_returns[anchor])
        step = reward_to_go - mean
        if config.norm_adv_by_std_in_grpo:
            step /= std + EPS
        for t in turn:
            advantages[i, t] += config.gigpo_step_weight * step
    return advantages, advantages


REFERENCES = {"gae": gae_reference, "bi_level_gae": bi_level_gae_reference, "grpo": grpo_reference,
              "rloo": rloo_reference, "reinforce": reinforce_reference,
              "reinforce_plus_plus": reinforce_plus_plus_reference, "gigpo": gigpo_reference}

ESTIMATOR_CASES = [
    pytest.param("gae", dict(gamma=0.9, lam=0.8, whiten_advantages=False), id="gae"),
    pytest.param("gae", dict(gamma=0.9, lam=0.8, whiten_advantages=True), id="gae-whiten"),
    pytest.param("gae", dict(gamma=1.0, lam=1.0, whiten_advantages=False), id="gae-undiscounted"),
    pytest.param("bi_level_gae", dict(gamma=0.9, lam=0.7, high_level_gamma=0.8, whiten_advantages=False),
                 id="bi_level_gae"),
    pytest.param("bi_level_gae", dict(gamma=0.9, lam=0.7, high_level_gamma=0.8, whiten_advantages=True),
                 id="bi_level_gae-whiten"),
    pytest.param("grpo", dict(norm_adv_by_std_in_grpo=True), id="grpo"),
    pytest.param("grpo", dict(norm_adv_by_std_in_grpo=False), id="grpo-no-std"),
    pytest.param("rloo", {}, id="rloo"),
    pytest.param("reinforce", {}, id="reinforce"),
    pytest.param("reinforce_plus_plus", dict(gamma=0.9), id="reinforce_plus_plus"),
    pytest.param("gigpo", dict(high_level_gamma=0.8, norm_adv_by_std_in_grpo=True), id="gigpo"),
    pytest.param("gigpo", dict(high_level_gamma=0.8, norm_adv_by_std_in_grpo=False, gigpo_step_weight=0.5),
                 id="gigpo-no-std"),
]
SEEDS = [0, 1, 2]


# ---- estimators against the loop references --------------------------------------------------------
def test_every_estimator_has_a_reference_and_a_case():
    assert set(REFERENCES) == set(ADV_ESTIMATORS)
    assert {case.values[0] for case in ESTIMATOR_CASES} == set(ADV_ESTIMATORS)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_batches_exercise_turns_padding_and_shared_anchor_states(seed):
    batch = random_batch(seed)
    assert (batch.turn_ends.sum(1) >= 2).any() and (batch.turn_ends.sum(1) == 1).any()
    assert (batch.loss_mask[:, -1] == 0).all()  # right padding
    anchors = [(batch.group_ids[i], int(batch.state_ids[i, t])) for i, t in batch.turn_ends.nonzero().tolist()]
    assert len(set(anchors)) < len(anchors)  # some state is answered twice within a group (GiGPO's step level)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name, settings", ESTIMATOR_CASES)
def test_estimator_matches_loop_reference(name, settings, seed):
    batch, config = random_batch(seed), AlgorithmConfig(**settings)
    advantages, returns = batch.estimate(name, config)
    expected_advantages, expected_returns = REFERENCES[name](batch, config, batch.loss_mask)
    assert_close(advantages, expected_advantages, atol=1e-4)
    assert_close(returns, expected_returns, atol=1e-4)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("whiten", [False, True])
def test_gae_over_the_whole_trajectory_matches_loop_reference(whiten, seed):
    # algorithm.adv_mask=trajectory: the state tokens between replies carry values and advantages too
    batch, config = random_batch(seed), AlgorithmConfig(gamma=0.9, lam=0.8, whiten_advantages=whiten)
    adv_mask = ADV_MASKS["trajectory"](batch.loss_mask)  # (B, T)
    assert (adv_mask > batch.loss_mask).any()
    advantages, returns = batch.estimate("gae", config, adv_mask=adv_mask)
    expected_advantages, expected_returns = gae_reference(batch, config, adv_mask)
    assert_close(advantages, expected_advantages, atol=1e-4)
    assert_close(returns, expected_returns, atol=1e-4)


# ---- hand-computed two-turn cases ------------------------------------------------------------------
# Layout [prompt, gen, gen, env, env, gen, gen]; rewards 1 on token 2 (turn 1's end) and 2 on token 6.
# Values 9 on the prompt and environment tokens: using any of them would change every number below.
HAND_VALUES = [[9.0, 0.2, 0.4, 9.0, 9.0, 0.6, 0.8]]


def test_gae_hand_computed_skips_environment_tokens():
    batch = two_turn_batch([[1.0, 2.0]], values=HAND_VALUES)
    advantages, returns = batch.estimate("gae", AlgorithmConfig(gamma=0.5, lam=0.5, whiten_advantages=False))
    # delta_6 = r6 - V6 = 2 - 0.8 = 1.2                          A6 = 1.2
    # delta_5 = 0 + 0.5 * V6 - V5 = 0.4 - 0.6 = -0.2            A5 = -0.2 + 0.25 * 1.2 = 0.1
    # delta_2 = r2 + 0.5 * V5 - V2 = 1 + 0.3 - 0.4 = 0.9        A2 = 0.9 + 0.25 * 0.1 = 0.925
    #   (the step after token 2 is token 5, turn 2's first generated token: V3 = V4 = 9 are skipped)
    # delta_1 = 0 + 0.5 * V2 - V1 = 0.2 - 0.2 = 0               A1 = 0 + 0.25 * 0.925 = 0.23125
    assert_close(advantages, [[0, 0.23125, 0.925, 0, 0, 0.1, 1.2]])
    # returns = A + V on the generated tokens
    assert_close(returns, [[0, 0.43125, 1.325, 0, 0, 0.7, 2.0]])


def test_bi_level_gae_hand_computed():
    batch = two_turn_batch([[1.0, 2.0]], values=HAND_VALUES)
    config = AlgorithmConfig(gamma=0.5, lam=1.0, high_level_gamma=0.9, whiten_advantages=False)
    advantages, returns = batch.estimate("bi_level_gae", config)
    # Turn level over the turn ends (tokens 2, 6), with high_level_gamma = 0.9:
    #   turn 2: delta = 2 - V6 = 1.2, A = 1.2, G2 = A + V6 = 2.0
    #   turn 1: delta = 1 + 0.9 * V6 - V2 = 1 + 0.72 - 0.4 = 1.32, A = 1.32 + 0.9 * 1.2 = 2.4, G1 = 2.4 + 0.4 = 2.8
    # Token level within each turn, with gamma = 0.5, the turn's last token earning G_k and nothing after it:
    #   A6 = G2 - V6 = 1.2;  A5 = 0 + 0.5 * V6 - V5 + 0.5 * A6 = -0.2 + 0.6 = 0.4
    #   A2 = G1 - V2 = 2.4;  A1 = 0 + 0.5 * V2 - V1 + 0.5 * A2 = 0 + 1.2 = 1.2
    assert_close(advantages, [[0, 1.2, 2.4, 0, 0, 0.4, 1.2]])
    assert_close(returns, [[0, 1.4, 2.8, 0, 0, 1.0, 2.0]])


# Group 4: scores 1 + 2 = 3, 0, 0 (mean 1, deviations 2, -1, -1, unbiased std sqrt(6 / 2) = sqrt(3)).
# Group 8: scores 2, 4 (mean 3, deviations -1, 1, std sqrt(2)).
@pytest.mark.parametrize("name, settings, expected", [
    ("grpo", dict(norm_adv_by_std_in_grpo=True), [2 / 3**0.5, -1 / 3**0.5, -1 / 3**0.5, -1 / 2**0.5, 1 / 2**0.5]),
    ("grpo", dict(norm_adv_by_std_in_grpo=False), [2.0, -1.0, -1.0, -1.0, 1.0]),
    # R_i - mean of the others: 3 - 0, 0 - 1.5, 0 - 1.5, 2 - 4, 4 - 2
    ("rloo", {}, [3.0, -1.5, -1.5, -2.0, 2.0]),
    ("reinforce", {}, [3.0, 0.0, 0.0, 2.0, 4.0]),
])
def test_trajectory_level_estimators_hand_computed(name, settings, expected):
    batch = two_turn_batch([[1.0, 2.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0], [3.0, 1.0]], group_ids=[4, 4, 4, 8, 8])
    advantages, returns = batch.estimate(name, AlgorithmConfig(**settings))
    assert_close(advantages, on_tokens([(a, a) for a in expected]))
    assert_close(returns, advantages)


def test_reinforce_plus_plus_hand_computed():
    batch = two_turn_batch([[1.0, 2.0]])
    advantages, returns = batch.estimate("reinforce_plus_plus", AlgorithmConfig(gamma=0.5))
    # reward-to-go over the generated tokens only: G6 = 2, G5 = 0.5 * 2 = 1, G2 = 1 + 0.5 * G5 = 1.5, G1 = 0.75
    assert_close(returns, [[0, 0.75, 1.5, 0, 0, 1.0, 2.0]])
    # whitened: mean 1.3125, deviations -0.5625, 0.1875, -0.3125, 0.6875, unbiased var 0.921875 / 3
    std = math.sqrt(0.921875 / 3)
    assert_close(advantages, [[0, -0.5625 / std, 0.1875 / std, 0, 0, -0.3125 / std, 0.6875 / std]])


@pytest.mark.parametrize("norm_by_std, expected", [
    (True, [(1.0, 1 + 1 / 2**0.5), (-2.0, -1 - 1 / 2**0.5), (1.0, 0.0), (0.0, 0.0)]),
    (False, [(1.0, 2.0), (-2.0, -2.0), (1.0, 0.0), (0.0, 0.0)]),
])
def test_gigpo_hand_computed(norm_by_std, expected):
    # Rows 0-2 share group 0 and start state 0; their second turns answer states 1, 1, 2.
    # Row 3 is alone in group 1 though it meets the same state ids: anchors never cross groups.
    batch = two_turn_batch([[0.0, 2.0], [0.0, 0.0], [3.0, -2.0], [5.0, 5.0]], group_ids=[0, 0, 0, 1],
                           turn_states=[[0, 1], [0, 1], [0, 2], [0, 1]])
    advantages, _ = batch.estimate("gigpo", AlgorithmConfig(high_level_gamma=0.5, norm_adv_by_std_in_grpo=norm_by_std))
    # Episode level, group 0: scores 2, 0, 1 (mean 1, std 1) -> 1, -1, 0 with or without std; row 3 alone -> 0.
    # Step returns R = r + 0.5 * R_next: row 0 (1, 2), row 1 (0, 0), row 2 (3 - 1 = 2, -2).
    # Anchor (0, state 0): R 1, 0, 2 (mean 1, std 1) -> 0, -1, 1 on the first turns.
    # Anchor (0, state 1): R 2, 0 (mean 1, std sqrt 2) -> +-1/sqrt(2) (+-1 without std) on rows 0, 1's second turns.
    # Anchor (0, state 2): row 2's second turn alone -> 0.
    # Row 0: (1 + 0, 1 + 1/sqrt2), row 1: (-1 - 1, -1 - 1/sqrt2), row 2: (0 + 1, 0 + 0), row 3: 0.
    assert_close(advantages, on_tokens(expected))


# ---- masks ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, settings", ESTIMATOR_CASES)
def test_tokens_outside_the_loss_mask_get_exactly_zero(name, settings):
    batch = random_batch(0)
    advantages, returns = batch.estimate(name, AlgorithmConfig(**settings))
    outside = batch.loss_mask == 0  # (B, T): prompt, environment and padding tokens
    assert (advantages[outside] == 0).all() and (returns[outside] == 0).all()
    assert (advantages[~outside] != 0).any()


@pytest.mark.parametrize("mode", list(LOSS_AGG_MODES))
def test_policy_loss_ignores_tokens_outside_the_loss_mask(mode):
    gen = torch.Generator().manual_seed(0)
    loss_mask = random_batch(0).loss_mask  # (B, T)
    outside = 1 - loss_mask
    log_probs, old_log_probs, advantages = (torch.randn(loss_mask.shape, generator=gen) * s for s in (0.3, 0.3, 1.0))

    def loss_of(log_probs, old_log_probs, advantages):
        per_token, _ = compute_policy_loss(log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages,
                                           loss_mask=loss_mask, clip_ratio_low=0.2, clip_ratio_high=0.28,
                                           clip_ratio_c=3.0)
        return agg_loss(per_token, loss_mask, mode)

    log_probs.requires_grad_()
    loss = loss_of(log_probs, old_log_probs, advantages)
    loss.backward()
    perturbed = loss_of(log_probs.detach() + 5 * torch.randn(loss_mask.shape, generator=gen) * outside,
                        old_log_probs - 5 * torch.randn(loss_mask.shape, generator=gen) * outside,
                        advantages + 100 * torch.randn(loss_mask.shape, generator=gen) * outside)
    assert perturbed.item() == loss.item()
    assert (log_probs.grad[outside.bool()] == 0).all() and (log_probs.grad[loss_mask.bool()] != 0).any()


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("name", ["grpo", "rloo", "gigpo"])
def test_group_of_one_and_group_of_equal_rewards_get_zero(name, norm_by_std):
    # group 5: a single trajectory; group 9: three trajectories with the same rewards turn by turn
    batch = two_turn_batch([[1.0, 2.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]], group_ids=[5, 9, 9, 9])
    advantages, returns = batch.estimate(name, AlgorithmConfig(norm_adv_by_std_in_grpo=norm_by_std))
    assert torch.equal(advantages, torch.zeros(4, 7)) and torch.equal(returns, torch.zeros(4, 7))


@pytest.mark.parametrize("name, norm_by_std", [
    ("grpo", True),
    ("grpo", False),
    ("rloo", True),
    ("gigpo", True),
    ("gigpo", False),
])
def test_group_of_equal_rewards_not_representable_in_float32_gets_zero(name, norm_by_std):
    # three identical trajectories scoring 2 + 0.9 = 2.9, whose float32 mean is not exactly 2.9
    batch = two_turn_batch([[2.0, 0.9]] * 3)
    advantages, _ = batch.estimate(name, AlgorithmConfig(norm_adv_by_std_in_grpo=norm_by_std))
    assert_close(advantages, torch.zeros(3, 7), atol=1e-6)


# ---- registry flags, checked against behaviour -----------------------------------------------------
@pytest.mark.parametrize("name", sorted(ADV_ESTIMATORS))
def test_registry_flags_match_behaviour(name):
    batch, config = random_batch(0), AlgorithmConfig(whiten_advantages=False)
    advantages, _ = batch.estimate(name, config)
    other_values = replace(batch, values=torch.randn(batch.values.shape, generator=torch.Generator().manual_seed(9)))
    reads_values = not torch.equal(advantages, other_values.estimate(name, config)[0])
    assert reads_values == ADV_ESTIMATORS[name].uses_critic
    # every trajectory alone in its group, every turn answering a state of its own
    alone = replace(batch, group_ids=np.arange(len(batch.group_ids)),
                    state_ids=torch.arange(batch.state_ids.numel()).view(batch.state_ids.shape))
    zero_when_alone = bool((alone.estimate(name, config)[0] == 0).all())
    assert zero_when_alone == ADV_ESTIMATORS[name].group_relative


# ---- reward normalisation ---------------------------------------------------------------------------
def test_reinforce_on_state_standardised_rewards_equals_grpo():
    batch = random_batch(1)
    scores = batch.token_rewards.sum(-1)  # (B,)
    assert all(len(set(scores[batch.group_ids == g].tolist())) > 1 for g in set(batch.group_ids))  # no zero std
    normalised = normalize_scores(scores, batch.group_ids, "mean_std")  # (B,)
    last_end = batch.turn_ends.shape[1] - 1 - batch.turn_ends.flip(1).int().argmax(1)  # (B,)
    token_rewards = torch.zeros_like(batch.token_rewards)  # (B, T): the normalised score on the last turn end
    token_rewards[torch.arange(len(scores)), last_end] = normalised
    reinforce, _ = replace(batch, token_rewards=token_rewards).estimate("reinforce", AlgorithmConfig())
    grpo, _ = batch.estimate("grpo", AlgorithmConfig(norm_adv_by_std_in_grpo=True))
    assert_close(reinforce, grpo)


SCORES = torch.tensor([1.0, 3.0, 5.0, 5.0, 2.0, 6.0])  # (B,)


@pytest.mark.parametrize("keys, method, expected", [
    (["a", "a", "b", "b", "c", "c"], "identity", [1.0, 3.0, 5.0, 5.0, 2.0, 6.0]),
    # means 2, 5, 4
    (["a", "a", "b", "b", "c", "c"], "mean", [-1.0, 1.0, 0.0, 0.0, -2.0, 2.0]),
    # stds sqrt(2), 0, sqrt(8): the zero-variance group "b" gets 0
    (["a", "a", "b", "b", "c", "c"], "mean_std", [-0.5**0.5, 0.5**0.5, 0.0, 0.0, -0.5**0.5, 0.5**0.5]),
    # interleaved integer keys: groups {1, 5, 2} (mean 8/3) and {3, 5, 6} (mean 14/3)
    ([0, 1, 0, 1, 0, 1], "mean", [1 - 8 / 3, 3 - 14 / 3, 5 - 8 / 3, 5 - 14 / 3, 2 - 8 / 3, 6 - 14 / 3]),
    # one group (grouping=batch): mean 11/3, unbiased var (64 + 4 + 16 + 16 + 25 + 49) / 9 / 5 = 174 / 45
    ([0] * 6, "mean_std", [(s - 11 / 3) / (174 / 45) ** 0.5 for s in [1.0, 3.0, 5.0, 5.0, 2.0, 6.0]]),
])
def test_normalize_scores_hand_computed(keys, method, expected):
    assert_close(normalize_scores(SCORES, np.array(keys), method), expected)


def test_asym_clip_clamps_standardised_scores_to_minus_one_three():
    # group 0: eleven 0s and one 1 -> z = 11/12 / sqrt(1/12) = 11/sqrt(12) = 3.18 -> 3, the others -1/sqrt(12)
    # group 1: 1, 1, -2 (mean 0, std sqrt(3)) -> 1/sqrt(3), 1/sqrt(3), -2/sqrt(3) = -1.15 -> -1
    scores = torch.tensor([0.0] * 11 + [1.0] + [1.0, 1.0, -2.0])  # (15,)
    keys = np.array([0] * 12 + [1] * 3)
    expected = [-1 / 12**0.5] * 11 + [3.0] + [1 / 3**0.5, 1 / 3**0.5, -1.0]
    assert_close(normalize_scores(scores, keys, "asym_clip"), expected)


@pytest.mark.parametrize("method", ["mean_std", "asym_clip"])
@pytest.mark.parametrize("score", [
    5.0,
    2.9,  # the float32 mean of three 2.9s is off by an ulp; the std > 1e-6 guard catches it
    10.9,  # in float32 the mean of three 10.9s was an ulp off and normalised each to 0.44
])
def test_equal_scores_normalise_to_zero(score, method):
    assert torch.equal(normalize_scores(torch.full((3,), score), np.zeros(3), method), torch.zeros(3))


# ---- loss aggregation -------------------------------------------------------------------------------
AGG_VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])  # (B, T)
AGG_MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # the last sequence is empty


@pytest.mark.parametrize("mode, expected", [
    ("token-mean", (1 + 2 + 4) / 3),
    ("seq-mean-token-sum", ((1 + 2) + 4) / 2),  # the empty sequence does not count
    ("seq-mean-token-mean", ((1 + 2) / 2 + 4) / 2),
])
def test_agg_loss_hand_computed(mode, expected):
    assert agg_loss(AGG_VALUES, AGG_MASK, mode).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", list(LOSS_AGG_MODES))
def test_micro_batches_over_the_full_batch_units_sum_to_the_full_batch_loss(mode):
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(6, 8, generator=gen)  # (B, T)
    mask = (torch.rand(6, 8, generator=gen) > 0.4).float()  # (B, T)
    mask[2] = 0  # an empty sequence
    mask[4] = 1
    _, units = LOSS_AGG_MODES[mode](values, mask)
    micro_batches = [slice(0, 1), slice(1, 3), slice(3, 6)]  # uneven on purpose
    accumulated = sum(LOSS_AGG_MODES[mode](values[s], mask[s])[0] for s in micro_batches) / units
    assert_close(accumulated, agg_loss(values, mask, mode))


# ---- policy loss ------------------------------------------------------------------------------------
def policy_loss(ratios, advantages, loss_mask=None, clip_ratio_c=3.0):
    """compute_policy_loss with clip [0.8, 1.28] at the given ratios (old log-probs 0); log_probs returned for grads."""
    log_probs = torch.log(torch.tensor([ratios])).requires_grad_()  # (1, T)
    loss, metrics = compute_policy_loss(
        log_probs=log_probs, old_log_probs=torch.zeros_like(log_probs), advantages=torch.tensor([advantages]),
        loss_mask=torch.ones_like(log_probs) if loss_mask is None else torch.tensor([loss_mask]),
        clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=clip_ratio_c)
    return loss, metrics, log_probs


@pytest.mark.parametrize("advantage, ratio, clipped", [
    (1.0, 1.5, True),  # A > 0 above 1 + high: no push further up
    (1.0, 1.25, False),  # inside the decoupled upper bound 1.28 (a symmetric 0.2 clip would stop here)
    (1.0, 0.5, False),  # A > 0 below 1 - low: still pushed up
    (-1.0, 0.7, True),  # A < 0 below 1 - low: no push further down
    (-1.0, 0.85, False),
    (-1.0, 1.5, False),  # A < 0 above 1 + high: still pushed down (dual clip only from 3)
])
def test_policy_loss_gradient_vanishes_exactly_outside_the_clip_range(advantage, ratio, clipped):
    loss, _, log_probs = policy_loss([ratio], [advantage])
    loss.sum().backward()
    assert (log_probs.grad.item() == 0) == clipped


def test_policy_loss_hand_computed_with_clip_fraction():
    # per token max(-A r, -A clip(r, 0.8, 1.28)):
    #   A=1, r=1.5: max(-1.5, -1.28) = -1.28 (clipped);   A=-1, r=0.5: max(0.5, 0.8) = 0.8 (clipped)
    #   A=2, r=1: -2;   A=1, r=0.5: max(-0.5, -0.8) = -0.5;   the last token would clip but is masked
    loss, metrics, _ = policy_loss([1.5, 0.5, 1.0, 0.5, 2.0], [1.0, -1.0, 2.0, 1.0, 1.0], loss_mask=[1, 1, 1, 1, 0])
    assert_close(loss[0, :4], [-1.28, 0.8, -2.0, -0.5])
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 4)
    assert metrics["pg_clipfrac_lower"].item() == 0
    assert metrics["ppo_kl"].item() == pytest.approx(-(math.log(1.5) + 2 * math.log(0.5)) / 4)


def test_dual_clip_bounds_the_loss_of_a_bad_token_with_a_huge_ratio():
    # A=-2, r=10: max(20, 2 * 1.28) = 20 -> dual clip min(20, -A * 3) = 6
    # A=-2, r=2: max(4, 2.56) = 4 < 6 stays;   A=2, r=10: ordinary clip -2 * 1.28 = -2.56, no dual clip for A > 0
    loss, metrics, log_probs = policy_loss([10.0, 2.0, 10.0], [-2.0, -2.0, 2.0])
    assert_close(loss, [[6.0, 4.0, -2.56]])
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(1 / 3)
    assert metrics["pg_clipfrac"].item() == pytest.approx(1 / 3)  # only the A > 0 token hit the ordinary clip
    loss.sum().backward()
    assert log_probs.grad[0, 0] == 0 and log_probs.grad[0, 1] != 0


# ---- rollout engine vs trainer ----------------------------------------------------------------------
def test_rollout_mismatch_hand_computed():
    # old - rollout on the masked tokens: 0.5, -1.0, 0 (and 3.0 on a token outside the mask)
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -4.0, 0.0]])
    rollout = torch.tensor([[-1.5, -1.0, -0.5], [-1.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    metrics = rollout_mismatch(old_log_probs=old, rollout_log_probs=rollout, loss_mask=mask)
    assert metrics["rollout_logprob_diff_mean"].item() == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert metrics["rollout_logprob_diff_max"].item() == pytest.approx(1.0)  # not the masked 3.0
    # k3 = exp(d) - 1 - d per token
    k3 = [math.exp(0.5) - 1.5, math.exp(-1.0) - 1 + 1.0, 0.0]
    assert metrics["rollout_kl"].item() == pytest.approx(sum(k3) / 3)


def test_rollout_kl_estimates_the_kl_from_the_rollouts_samples():
    """Tokens drawn from the rollout's distribution q: the mean k3 over them approaches KL(q || p)."""
    gen = torch.Generator().manual_seed(0)
    q_logits, p_logits = torch.randn(8, generator=gen), torch.randn(8, generator=gen)
    q, p = q_logits.log_softmax(-1), p_logits.log_softmax(-1)
    tokens = torch.multinomial(q.exp(), 200_000, replacement=True, generator=gen)[None]  # (1, N)
    metrics = rollout_mismatch(old_log_probs=p[tokens], rollout_log_probs=q[tokens],
                               loss_mask=torch.ones(tokens.shape))
    exact = (q.exp() * (q - p)).sum().item()
    assert metrics["rollout_kl"].item() == pytest.approx(exact, rel=0.03)


def test_truncated_is_weights_hand_computed():
    # exp(old - rollout) capped at 2: exp(0.5) = 1.6487, exp(-1) = 0.3679, exp(3) -> 2, exp(0) = 1
    old = torch.tensor([[-1.0, -2.0, -1.0, 0.0]], requires_grad=True)
    rollout = torch.tensor([[-1.5, -1.0, -4.0, 0.0]])
    weights = truncated_is_weights(old_log_probs=old, rollout_log_probs=rollout, cap=2.0)
    assert_close(weights, [[math.exp(0.5), math.exp(-1.0), 2.0, 1.0]])
    assert not weights.requires_grad


# ---- value loss, explained variance ----------------------------------------------------------------
def test_value_loss_hand_computed():
    # cliprange 0.5, old values 0:
    #   V=1, R=0: V_clip 0.5; max(1, 0.25) = 1 -> 0.5, unclipped wins
    #   V=2, R=3: V_clip 0.5; max(1, 6.25) -> 3.125, clipped wins
    #   V=-1, R=-2: V_clip -0.5; max(1, 2.25) -> 1.125, clipped wins
    #   V=0.2, R=1: within the range, both 0.64 -> 0.32
    loss, clipped = compute_value_loss(values=torch.tensor([1.0, 2.0, -1.0, 0.2]), old_values=torch.zeros(4),
                                       returns=torch.tensor([0.0, 3.0, -2.0, 1.0]), cliprange_value=0.5)
    assert_close(loss, [0.5, 3.125, 1.125, 0.32])
    assert clipped.tolist() == [0.0, 1.0, 1.0, 0.0]


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 50.0]])  # (1, T); the last token is masked out
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.0), returns, mask) == pytest.approx(0.0, abs=1e-6)
    # residual 0, 0, 1: variance 2/9 against the returns' 2/3 -> 1 - 1/3
    assert explained_variance(torch.tensor([[1.0, 2.0, 2.0, -7.0]]), returns, mask) == pytest.approx(2 / 3)
    assert explained_variance(returns, torch.ones_like(returns), mask) is None  # constant returns: undefined
    # float32 rounding of equal returns (one ulp apart) is not variance: no -1e14
    ulp_apart = torch.tensor([[0.3, 0.3, 0.3 + 3e-8, 0.0]])
    assert explained_variance(torch.randn(1, 4), ulp_apart, mask) is None
    assert explained_variance(torch.zeros(1, 4), torch.zeros(1, 4), mask) is None


# ---- KL ---------------------------------------------------------------------------------------------
KL_FORMULAS = {  # of d = log_probs - ref_log_probs
    "k1": lambda d: d,
    "abs": lambda d: d.abs(),
    "k2": lambda d: 0.5 * d**2,
    "k3": lambda d: torch.exp(-d) + d - 1,  # exp(ref - logp) - (ref - logp) - 1
}


@pytest.mark.parametrize("name", list(KL_FORMULAS))
def test_kl_penalty_matches_its_formula(name):
    gen = torch.Generator().manual_seed(0)
    log_probs, ref_log_probs = -torch.rand(4, 6, generator=gen) * 3, -torch.rand(4, 6, generator=gen) * 3
    assert_close(KL_PENALTIES[name](log_probs, ref_log_probs), KL_FORMULAS[name](log_probs - ref_log_probs))


@pytest.mark.parametrize("alias, name", [("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3")])
def test_kl_penalty_aliases(alias, name):
    gen = torch.Generator().manual_seed(1)
    log_probs, ref_log_probs = -torch.rand(3, 5, generator=gen) * 3, -torch.rand(3, 5, generator=gen) * 3
    assert torch.equal(KL_PENALTIES[alias](log_probs, ref_log_probs), KL_PENALTIES[name](log_probs, ref_log_probs))


def test_low_var_kl_is_clamped_at_ten():
    # ref - logp = 20: exp(20) - 21 -> 10;  -20: exp(-20) + 19 = 19 -> 10;  0.5: exp(0.5) - 1.5 = 0.148721
    kl = KL_PENALTIES["k3"](torch.zeros(3), torch.tensor([20.0, -20.0, 0.5]))
    assert_close(kl, [10.0, 10.0, math.exp(0.5) - 1.5])


def test_apply_kl_penalty_only_on_generated_tokens():
    token_rewards = torch.tensor([[5.0, 0.0, 0.0, 1.0]])  # (1, T)
    old_log_probs = torch.tensor([[-1.0, -1.0, -2.0, -3.0]])
    ref_log_probs = torch.tensor([[-3.0, -2.0, -2.0, -1.0]])  # k1 = 2, 1, 0, -2
    loss_mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])  # token 0 is the prompt: its KL of 2 must not count
    rewards, mean_kl = apply_kl_penalty(token_rewards, old_log_probs, ref_log_probs, loss_mask, "k1", kl_coef=0.5)
    assert_close(rewards, [[5.0, -0.5, 0.0, 2.0]])
    assert mean_kl == pytest.approx((1 + 0 - 2) / 3)


def test_fixed_kl_controller_never_moves():
    controller = KL_CONTROLLERS["fixed"](kl_coef=0.1, target_kl=0.01, horizon=10)
    controller.update(current_kl=5.0, n_steps=100)
    assert controller.value == 0.1


def test_adaptive_kl_controller_moves_by_the_clipped_proportional_error():
    controller = KL_CONTROLLERS["adaptive"](kl_coef=0.1, target_kl=0.1, horizon=100)
    assert isinstance(controller, AdaptiveKLController)
    controller.update(current_kl=0.11, n_steps=50)  # error 0.11 / 0.1 - 1 = 0.1: 0.1 * (1 + 0.1 * 50 / 100)
    assert controller.value == pytest.approx(0.105)
    controller.update(current_kl=0.5, n_steps=50)  # error 4 clipped to 0.2: 0.105 * (1 + 0.2 * 0.5)
    assert controller.value == pytest.approx(0.1155)
    controller.update(current_kl=0.0, n_steps=100)  # error -1 clipped to -0.2: 0.1155 * 0.8
    assert controller.value == pytest.approx(0.0924)


@pytest.mark.parametrize("kl", [float("nan"), float("inf")])
def test_adaptive_kl_controller_ignores_a_non_finite_kl(kl):
    controller = KL_CONTROLLERS["adaptive"](kl_coef=0.1, target_kl=0.1, horizon=100)
    controller.update(current_kl=kl, n_steps=50)
    assert controller.value == 0.1  # a NaN coefficient would stay NaN for the rest of the run
    controller.update(current_kl=0.11, n_steps=50)
    assert controller.value == pytest.approx(0.105)


# ---- rollout filter ------------------------------------------------------------------------------------
def reference_select_groups(scores: list[float], strategy: str, value: float, largest: bool, include_zero: bool,
                            prob_mode: str, fill: int = 1, multiple: int = 1, eps: float = 0.01) -> list[int]:
    """RAGEN-2's group selection as a loop over the ranked groups, then our rounding: up to whole mini-batches
    (`fill`) or all the candidates, then down to equal rank shares (`multiple`). A share reached in exact
    arithmetic counts as reached (the 1e-9 slack)."""
    candidates = [g for g, s in enumerate(scores) if not math.isnan(s) and (include_zero or abs(s) > 1e-10)]
    candidates.sort(key=lambda g: -scores[g] if largest else scores[g])  # a stable sort: ties keep the earlier group
    ranked = [scores[g] for g in candidates]
    if strategy == "top_p" and value >= 1:
        count = len(ranked)
    elif strategy == "top_p" and prob_mode == "linear":
        threshold, total, kept = value * sum(ranked) - eps, 0.0, 0
        for score in ranked:  # RAGEN-2's order: is the share reached? then is the next score positive? then add
            if (total >= threshold - 1e-9 and threshold > 0) or score <= 0:
                break
            total, kept = total + score, kept + 1
        count = kept if total >= threshold - 1e-9 and threshold > 0 else 0
    elif strategy == "top_p":
        weights = [math.exp(s if largest else -s) for s in ranked]
        total, count = 0.0, len(ranked)
        for i, weight in enumerate(weights):
            total += weight / sum(weights)
            if total >= value - 1e-9:
                count = i + 1
                break
    elif strategy == "top_k":
        count = max(1, int(value * len(scores) + 1e-9))
    elif strategy == "top_k_abs":
        count = max(1, int(value))
    else:  # min_p
        count = sum(1 for s in ranked if (s >= value * ranked[0] if largest else s <= ranked[0] / value))
    count = min(-(-count // fill) * fill, len(ranked))
    return candidates[:count - count % multiple]


def select(scores, strategy, value, filter_type="largest", include_zero=True, prob_mode="linear", fill=1,
           multiple=1, eps=0.01):
    kept = select_groups(torch.as_tensor(scores, dtype=torch.float32), strategy=strategy, value=value,
                         largest=filter_type == "largest", include_zero=include_zero, prob_mode=prob_mode,
                         selection_eps=eps, fill=fill, multiple=multiple)
    return kept.tolist()


GROUP_SCORES = [0.1, 0.5, 0.0, 0.3, 0.2, 0.4]  # (G,); total 1.5; ranked 1, 5, 3, 4, 0, 2 (largest first)


@pytest.mark.parametrize("value, filter_type, include_zero, expected", [
    (0.5, "largest", True, [1, 5]),  # threshold 0.75 - 0.01: 0.5 < 0.74 <= 0.5 + 0.4
    (0.9, "largest", True, [1, 5, 3, 4]),  # 1.35 - 0.01: 1.2 < 1.34 <= 1.4
    (0.9, "largest", False, [1, 5, 3, 4]),
    (0.2, "largest", True, [1]),
    (0.5, "smallest", True, []),  # ascending, the zero group comes first and ends the selection
    (0.5, "smallest", False, [0, 4, 3, 5]),  # 0.1 + 0.2 + 0.3 = 0.6 < 0.74 <= 1.0
])
def test_top_p_linear(value, filter_type, include_zero, expected):
    assert select(GROUP_SCORES, "top_p", value, filter_type, include_zero) == expected


def test_top_p_linear_stops_the_eps_short_of_the_share():
    assert select([0.595, 0.405], "top_p", 0.6) == [0]  # 0.595 >= 0.6 * 1.0 - 0.01
    assert select([0.58, 0.42], "top_p", 0.6) == [0, 1]
    assert select([0.595, 0.405], "top_p", 0.6, eps=0.0) == [0, 1]  # rollout_filter_selection_eps=0: the share itself
    assert select([0.58, 0.42], "top_p", 0.6, eps=0.05) == [0]  # 0.58 >= 0.6 - 0.05


@pytest.mark.parametrize("scores, value, prob_mode, kept", [
    ([0.35, 0.25, 0.15, 0.05], 0.95, "linear", 3),  # 0.35 + 0.25 + 0.15 = 0.75 = 0.95 * 0.8 - 0.01 exactly
    ([1.0] * 10, 0.9, "softmax", 9),  # nine weights of 0.1 hold 0.9 exactly (their float sum is 0.8999999999999999)
    ([1.0] * 10, 0.8, "softmax", 8),
    ([1.0] * 20, 0.5, "softmax", 10),
])
def test_top_p_counts_a_share_reached_in_exact_arithmetic_as_reached(scores, value, prob_mode, kept):
    assert len(select(scores, "top_p", value, prob_mode=prob_mode)) == kept


@pytest.mark.parametrize("scores, filter_type, include_zero", [
    ([0.0, 0.0, 0.0], "largest", True),  # an all-zero batch: nothing to add
    ([0.0, 0.0, 0.0], "smallest", True),
    ([-0.1, -0.3], "largest", True),  # rewards below 0 (metric reward): the first score <= 0 stops it at once
    ([0.5, -0.2, 0.3], "smallest", False),  # ascending: -0.2 first, before the share is reached
    ([0.5, -0.75], "largest", True),  # a share <= 0 (0.9 * -0.25 - 0.01) needs no group: RAGEN-2 keeps none
    ([0.005, 0.003], "largest", True),  # 0.9 * 0.008 - 0.01 < 0: spreads too small to count
])
def test_top_p_linear_is_empty_when_the_share_is_never_reached(scores, filter_type, include_zero):
    assert select(scores, "top_p", 0.9, filter_type, include_zero) == []


@pytest.mark.parametrize("value, filter_type, expected", [
    # scores 0, ln 2, ln 4: softmax 1/7, 2/7, 4/7; of -scores 4/7, 2/7, 1/7
    (0.5, "largest", [2]), (0.6, "largest", [2, 1]), (0.9, "largest", [2, 1, 0]),
    (0.5, "smallest", [0]), (0.6, "smallest", [0, 1]),
])
def test_top_p_softmax(value, filter_type, expected):
    assert select([0.0, math.log(2), math.log(4)], "top_p", value, filter_type, prob_mode="softmax") == expected


@pytest.mark.parametrize("prob_mode", ["linear", "softmax"])
@pytest.mark.parametrize("value", [1.0, 2.0])
def test_top_p_from_one_keeps_every_group_or_every_non_zero_one(prob_mode, value):
    # include_zero: the batch passes untouched; without it, only the zero-score group goes
    assert sorted(select(GROUP_SCORES, "top_p", value, prob_mode=prob_mode)) == [0, 1, 2, 3, 4, 5]
    assert sorted(select(GROUP_SCORES, "top_p", value, include_zero=False, prob_mode=prob_mode)) == [0, 1, 3, 4, 5]
    assert select([0.0, 0.0], "top_p", value, include_zero=False, prob_mode=prob_mode) == []


@pytest.mark.parametrize("strategy, value, filter_type, include_zero, expected", [
    ("top_k", 0.5, "largest", True, [1, 5, 3]),  # int(0.5 * 6) = 3 highest
    ("top_k", 0.5, "smallest", True, [2, 0, 4]),
    ("top_k", 0.5, "smallest", False, [0, 4, 3]),
    ("top_k", 0.4, "largest", True, [1, 5]),  # int(2.4) = 2
    ("top_k", 0.01, "largest", True, [1]),  # at least one
    ("top_k", 1.0, "largest", True, [1, 5, 3, 4, 0, 2]),
    ("top_k", 1.0, "largest", False, [1, 5, 3, 4, 0]),  # never more than the candidates
    ("top_k_abs", 2, "largest", True, [1, 5]),
    ("top_k_abs", 2, "smallest", True, [2, 0]),
    ("top_k_abs", 10, "largest", False, [1, 5, 3, 4, 0]),
    ("min_p", 0.5, "largest", True, [1, 5, 3]),  # >= 0.5 * 0.5
    ("min_p", 1.0, "largest", True, [1]),
    ("min_p", 0.5, "smallest", False, [0, 4]),  # <= 0.1 / 0.5
    ("min_p", 0.5, "smallest", True, [2]),  # <= 0 / 0.5: the zero group only
])
def test_top_k_top_k_abs_and_min_p(strategy, value, filter_type, include_zero, expected):
    assert select(GROUP_SCORES, strategy, value, filter_type, include_zero) == expected


def test_top_k_counts_a_fraction_of_every_group_without_float_loss():
    assert len(select([float(g + 1) for g in range(100)], "top_k", 0.29)) == 29  # 0.29 * 100 = 28.999...


def test_min_p_on_negative_scores_keeps_nothing():
    assert select([-0.2, -0.1], "min_p", 0.5) == []  # nothing is >= 0.5 * -0.1


@pytest.mark.parametrize("strategy, value, filter_type, expected", [
    ("top_k", 0.5, "largest", [2, 0]),  # 2 of the 4 groups; the NaN groups are never kept
    ("top_k", 0.5, "smallest", [0, 2]),
    ("top_k", 1.0, "largest", [2, 0]),
    ("top_p", 1.0, "smallest", [0, 2]),
    ("top_p", 0.5, "largest", [2]),  # the total is that of the finite scores: 0.5 >= 0.5 * 0.6 - 0.01
    ("min_p", 0.1, "largest", [2, 0]),
])
def test_a_nan_score_a_group_with_a_failed_environment_is_never_kept(strategy, value, filter_type, expected):
    nan = float("nan")
    assert select([0.1, nan, 0.5, nan], strategy, value, filter_type) == expected
    assert select([nan, nan], strategy, value, filter_type) == []


@pytest.mark.parametrize("strategy, value, include_zero, fill, multiple, expected", [
    ("top_k", 1 / 6, True, 4, 1, [1, 5, 3, 4]),  # 1 -> 4: the next-ranked groups fill the mini-batch
    ("top_p", 0.5, True, 3, 1, [1, 5, 3]),  # 2 -> 3
    ("top_k", 0.8, True, 4, 1, [1, 5, 3, 4]),  # 4 stays 4
    ("top_k", 0.9, True, 4, 1, [1, 5, 3, 4, 0, 2]),  # 5 -> 8 is more than the 6 groups: all 6, one short batch
    ("top_p", 1.0, False, 2, 1, [1, 5, 3, 4, 0]),  # 5 candidates: 6 would take the zero group back
    ("top_p", 0.9, False, 5, 1, [1, 5, 3, 4, 0]),  # 4 -> 5, all the candidates
    ("top_k_abs", 1, False, 6, 1, [1, 5, 3, 4, 0]),  # 6 groups per mini-batch, 5 candidates: all 5
    ("top_k_abs", 1, False, 6, 2, [1, 5, 3, 4]),  # ... in equal shares for ranks of one group each
    ("top_k_abs", 1, False, 1, 2, []),  # one group cannot be shared by 2 ranks
    ("top_k_abs", 3, False, 1, 2, [1, 5]),
])
def test_the_kept_count_fills_whole_mini_batches_and_equal_rank_shares(strategy, value, include_zero, fill,
                                                                       multiple, expected):
    assert select(GROUP_SCORES, strategy, value, include_zero=include_zero, fill=fill, multiple=multiple) == expected


def test_a_lone_informative_group_is_kept_though_it_fills_no_mini_batch():
    # a sparse step: one group of 8 with mixed outcomes, mini-batches of 2 groups
    assert select([0.0, 0.0, 0.8, 0.0, 0.0, 0.0, 0.0, 0.0], "top_p", 0.9, include_zero=False, fill=2) == [2]


def test_an_empty_selection_stays_empty_with_mini_batches():
    assert select([0.0, 0.0, 0.0, 0.0], "top_p", 0.9, fill=2) == []


@pytest.mark.parametrize("strategy, values", [("top_p", [0.3, 0.6, 0.9, 1.0]), ("top_k", [0.1, 0.5, 1.0]),
                                              ("top_k_abs", [1, 3, 20]), ("min_p", [0.1, 0.5, 1.0])])
def test_select_groups_matches_the_loop_reference(strategy, values):
    generator = torch.Generator().manual_seed(0)
    for trial in range(60):
        n_groups = int(torch.randint(1, 13, (1,), generator=generator))
        # multiples of 1/8 (exact sums, ties), some zeros, negatives (metric reward) and failed groups
        scores = (torch.randint(-2, 9, (n_groups,), generator=generator) / 8).tolist()
        scores = [s if trial % 3 or s >= 0 else 0.0 for s in scores]  # two trials in three without negatives
        scores = [float("nan") if u < 0.15 else s for s, u in zip(scores, torch.rand(n_groups, generator=generator))]
        for value in values:
            for filter_type in ("largest", "smallest"):
                for include_zero in (True, False):
                    for prob_mode in ("linear", "softmax"):
                        for fill, multiple in ((1, 1), (2, 1), (3, 1), (4, 2), (3, 3)):
                            for eps in (0.01, 0.0):
                                args = (strategy, value, filter_type == "largest", include_zero, prob_mode, fill,
                                        multiple, eps)
                                assert select(scores, strategy, value, filter_type, include_zero, prob_mode, fill,
                                              multiple, eps) == reference_select_groups(scores, *args), (scores, args)


def test_filter_metrics_score_each_group():
    index = torch.tensor([0, 0, 1, 1, 2, 2])
    rewards = torch.tensor([1.0, 0.0, 2.0, 2.0, 3.0, 1.0])
    loss_mask = torch.tensor([[0., 1, 1, 0], [0., 1, 0, 0], [0., 1, 1, 1], [0., 1, 1, 1], [0., 0, 0, 0],
                              [0., 1, 1, 1]])  # (B, T); the fifth trajectory generated nothing
    log_probs = torch.tensor([[-9., -1, -3, -9], [-9., -2, -9, -9], [-9., -1, -1, -1], [-9., -3, -3, -3],
                              [-9., -9, -9, -9], [-9., -0.5, -0.5, -0.5]])  # (B, T); -9 where nothing was sampled

    def score(metric):
        return FILTER_METRICS[metric](trajectory_rewards=rewards, loss_mask=loss_mask, rollout_log_probs=log_probs,
                                      index=index).tolist()

    assert score("reward_variance") == pytest.approx([0.5 ** 0.5, 0.0, 2 ** 0.5])  # unbiased std
    assert score("reward_std") == score("reward_variance")
    assert score("reward") == pytest.approx([0.5, 2.0, 2.0])
    assert score("reward_sum") == pytest.approx([1.0, 4.0, 4.0])
    assert score("length") == pytest.approx([1.5, 3.0, 1.5])
    # per trajectory: minus the mean log-prob of its sampled tokens (2, 2; 1, 3; 0, 0.5), then the group's mean
    assert score("entropy") == pytest.approx([2.0, 2.0, 0.25])
    assert score("entropy_variance") == pytest.approx([0.0, 2 ** 0.5, 0.5 ** 0.5 / 2])  # the std of those two
    assert score("entropy_std") == score("entropy_variance")


# ---- masks ------------------------------------------------------------------------------------------
HAND_LOSS_MASK = torch.tensor([
    [0, 1, 1, 0, 0, 1, 1, 0, 0],  # two replies, right padding
    [0, 0, 1, 0, 1, 1, 1, 1, 1],  # a one-token reply, then a reply running to the last position
    [0, 0, 0, 0, 0, 0, 0, 0, 0],  # nothing generated
], dtype=torch.float32)  # (B, T)


def test_turn_end_mask_hand_case():
    assert turn_end_mask(HAND_LOSS_MASK).int().tolist() == [
        [0, 0, 1, 0, 0, 0, 1, 0, 0],
        [0, 0, 1, 0, 0, 0, 0, 0, 1],
        [0, 0, 0, 0, 0, 0, 0, 0, 0],
    ]


@pytest.mark.parametrize("seed", SEEDS)
def test_turn_end_mask_finds_the_builders_turn_ends(seed):
    batch = random_batch(seed)
    assert torch.equal(turn_end_mask(batch.loss_mask), batch.turn_ends)


def test_span_mask_hand_case():
    assert span_mask(HAND_LOSS_MASK).tolist() == [
        [0, 1, 1, 1, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 1, 1, 1, 1],
        [0, 0, 0, 0, 0, 0, 0, 0, 0],
    ]
    assert torch.equal(ADV_MASKS["trajectory"](HAND_LOSS_MASK), span_mask(HAND_LOSS_MASK))
    assert torch.equal(ADV_MASKS["response"](HAND_LOSS_MASK), HAND_LOSS_MASK)


# ---- small helpers ------------------------------------------------------------------------------------
def test_masked_mean_of_an_empty_mask_is_zero():
    assert masked_mean(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.0, 1.0, 1.0])).item() == 2.5
    assert masked_mean(torch.ones(3), torch.zeros(3)).item() == 0.0


def test_entropy_of_uniform_logits_is_log_vocab():
    uniform, sure = torch.log_softmax(torch.zeros(2, 3, 10), -1), torch.log_softmax(torch.tensor([[[0.0, -1e4]]]), -1)
    assert_close(entropy_from_log_probs(uniform), torch.full((2, 3), math.log(10)))
    assert_close(entropy_from_log_probs(sure), [[0.0]])  # one sure token


@pytest.mark.parametrize("lengths, n_parts", [([5, 1, 4, 2, 3, 3], 2), ([9, 1, 1, 1, 8, 2, 2, 2], 4), ([7] * 6, 3)])
def test_balanced_order_is_a_permutation_with_near_equal_token_shares(lengths, n_parts):
    order = balanced_order(lengths, n_parts)
    assert sorted(order) == list(range(len(lengths)))
    size = len(lengths) // n_parts
    shares = [sum(lengths[i] for i in order[p * size:(p + 1) * size]) for p in range(n_parts)]
    assert max(shares) - min(shares) <= max(lengths) - min(lengths)  # no worse than one swap apart
    contiguous = [sum(lengths[p * size:(p + 1) * size]) for p in range(n_parts)]
    assert max(shares) - min(shares) <= max(contiguous) - min(contiguous)  # never worse than the plain split
