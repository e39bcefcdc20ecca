"""The RL math as pure tensor functions, kept in small dict registries.

Shapes: B trajectories, T tokens. Every per-token tensor is aligned with `input_ids` (B, T): position t
holds the quantity of token t (its log-prob given tokens < t, its value V(tokens < t), its reward, its
advantage). Two masks select tokens:
- `loss_mask` is 1 exactly on the tokens the model generated; only they are ever trained on.
- `adv_mask` marks the tokens that carry advantages and values. By default it equals `loss_mask`, so the
  TD recursion of GAE jumps from a turn's last reply token straight to the next turn's first reply token,
  skipping the environment's tokens (`algorithm.adv_mask=trajectory` lets the state tokens in as well).
`turn_ends` (B, T) marks each turn's last generated token, where that turn's reward sits.
TRICO's selective masks (VAGEN) narrow both to kinds of generated text (`reply_kinds` (B, T): 1 + the index
in config.REPLY_KINDS of each generated token's kind, think | observation | prediction | answer | format, 0 on
the other tokens): `algorithm.adv_spans` keeps the generated tokens of those kinds in `adv_mask` (and every
turn end), and `algorithm.loss_spans` those the policy loss covers: the trainer narrows `loss_mask` to them
once the advantages are computed, so from there on `loss_mask` is what the actor trains on.

Advantage estimators share one keyword signature
    estimator(*, token_rewards, values, adv_mask, turn_ends, group_ids, state_ids, config) -> (advantages, returns)
where `values` is (B, T) (zeros without a critic), `group_ids` (B,) says which trajectories share a start
state, and `state_ids` (B, T) gives each token the id of the state its turn answered (GiGPO's anchor
states). They live in ADV_ESTIMATORS, which the trainer indexes by `algorithm.adv_estimator`.

Departures from the textbook, on purpose:
- Estimators that compare whole trajectories (grpo, rloo, reinforce, gigpo's episode part) read the
  trajectory's reward as the sum of its token rewards.
- GAE-family advantages are whitened over the batch's tokens (veRL's behaviour), switchable with
  `algorithm.whiten_advantages`; returns are computed before whitening.
"""

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from verl.trainer.config import REPLY_KINDS, AlgorithmConfig

EPS = 1e-6  # guards divisions by a group's reward std, as in GRPO's reference implementation
CONSTANT_RELATIVE_VARIANCE = 1e-10  # returns whose variance is below this share of their mean square are constant


# ---- masks and group statistics -----------------------------------------------------------------
def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(values - mean) / std over the masked entries (unbiased variance); zero outside the mask."""
    n = mask.sum()
    mean = masked_mean(values, mask)
    var = ((values - mean) ** 2 * mask).sum() / (n - 1).clamp(min=1)
    return (values - mean) * torch.rsqrt(var + eps) * mask


def turn_end_mask(loss_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: generated tokens whose successor is not generated, i.e. each reply's last token."""
    generated = loss_mask.bool()
    next_generated = F.pad(generated[:, 1:], (0, 1), value=False)
    return generated & ~next_generated


def span_mask(loss_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) float: every token from the first generated token to the last, state tokens included."""
    generated = loss_mask.bool()
    started = generated.int().cummax(dim=1).values.bool()
    not_finished = generated.flip(1).int().cummax(dim=1).values.flip(1).bool()
    return (started & not_finished).float()


def kinds_mask(reply_kinds: torch.Tensor, kinds: list[str]) -> torch.Tensor:
    """(B, T) bool: the generated tokens whose kind (module docstring) is one of `kinds`."""
    ids = torch.tensor([REPLY_KINDS.index(kind) + 1 for kind in kinds], dtype=reply_kinds.dtype)
    return torch.isin(reply_kinds, ids)


ADV_MASKS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "response": lambda loss_mask: loss_mask.float(),
    "trajectory": span_mask,
}


def group_index(keys: np.ndarray) -> torch.Tensor:
    """Arbitrary hashable keys (B,) -> dense group indices (B,) in [0, G)."""
    _, index = np.unique(np.asarray(keys), return_inverse=True)
    return torch.as_tensor(index.reshape(-1), dtype=torch.long)


def group_mean_std(scores: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample mean and unbiased std of its group's scores (std 0 for a group of one).

    Computed in float64: there the mean of equal float32 scores is exact, so a group of equal rewards
    has std exactly 0 (in float32 it is an ulp, which a division by std + eps would blow up).
    """
    values = scores.double()
    n_groups = int(index.max()) + 1
    zeros = torch.zeros(n_groups, dtype=torch.float64, device=scores.device)
    counts = zeros.index_add(0, index, torch.ones_like(values))
    means = zeros.index_add(0, index, values) / counts
    centred = values - means[index]
    variances = zeros.index_add(0, index, centred**2) / (counts - 1).clamp(min=1)
    return means[index].to(scores.dtype), variances.sqrt()[index].to(scores.dtype)


# ---- advantage estimators -----------------------------------------------------------------------
def gae_recursion(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float,
                  episode_ends: torch.Tensor | None = None) -> torch.Tensor:
    """GAE over the tokens of `mask` (B, T), the next masked token being the next step:
    delta_t = r_t + gamma * V_next - V_t,  A_t = delta_t + gamma * lam * A_next.
    After the last masked token, and after any token of `episode_ends`, V_next = A_next = 0."""
    mask = mask.bool()
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])  # (B,)
    next_advantage = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[1])):
        if episode_ends is not None:
            next_value = torch.where(episode_ends[:, t], 0.0, next_value)
            next_advantage = torch.where(episode_ends[:, t], 0.0, next_advantage)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = torch.where(mask[:, t], advantage, 0.0)
        next_value = torch.where(mask[:, t], values[:, t], next_value)
        next_advantage = torch.where(mask[:, t], advantage, next_advantage)
    return advantages


def compute_gae(*, token_rewards, values, adv_mask, turn_ends, group_ids, state_ids, config: AlgorithmConfig):
    """GAE over the tokens of `adv_mask`: the TD recursion steps from a turn's last reply token straight to
    the next turn's first one, so environment tokens are skipped."""
    advantages = gae_recursion(token_rewards, values, adv_mask, config.gamma, config.lam)
    returns = (advantages + values) * adv_mask
    if config.whiten_advantages:
        advantages = masked_whiten(advantages, adv_mask)
    return advantages, returns


def compute_bi_level_gae(*, token_rewards, values, adv_mask, turn_ends, group_ids, state_ids,
                         config: AlgorithmConfig):
    """Bi-level GAE (VAGEN): GAE across turns with `high_level_gamma`, then GAE within each turn with `gamma`.

    Turn level, over the turns' last tokens e_k: delta_k = r(e_k) + high_level_gamma * V(e_{k+1}) - V(e_k),
    A_k = delta_k + high_level_gamma * lam * A_{k+1}; the turn's return is G_k = A_k + V(e_k).
    Token level, within turn k: the last token's reward is G_k and nothing follows it; other tokens keep
    their own reward (a KL penalty, say). A turn's credit thus reaches its tokens with gamma, and earlier
    turns with high_level_gamma.
    """
    ends = turn_ends.bool()
    turn_advantages = gae_recursion(token_rewards, values, ends, config.high_level_gamma, config.lam)
    turn_returns = (turn_advantages + values) * ends  # G_k at e_k
    rewards = torch.where(ends, turn_returns, token_rewards)
    advantages = gae_recursion(rewards, values, adv_mask, config.gamma, config.lam, episode_ends=ends)
    returns = (advantages + values) * adv_mask
    if config.whiten_advantages:
        advantages = masked_whiten(advantages, adv_mask)
    return advantages, returns


def compute_grpo(*, token_rewards, values, adv_mask, turn_ends, group_ids, state_ids, config: AlgorithmConfig):
    """GRPO: A_i = (R_i - mean(R_group)) / (std(R_group) + eps) on every token; without std (Dr. GRPO) just
    R_i - mean. std is the unbiased sample std; a group of one, or of equal rewards, gets A = 0."""
    scores = token_rewards.sum(dim=-1)  # (B,)
    means, stds = group_mean_std(scores, group_index(group_ids).to(scores.device))
    centred = scores - means  # exactly 0 in a group of equal rewards: its mean is exact
    if config.norm_adv_by_std_in_grpo:
        centred = centred / (stds + EPS)
    advantages = centred[:, None] * adv_mask
    return advantages, advantages


def compute_rloo(*, token_rewards, values, adv_mask, turn_ends, group_ids, state_ids, config: AlgorithmConfig):
    """RLOO: A_i = R_i - mean of the other n-1 rewards of its group = n / (n-1) * (R_i - mean); 0 if n = 1."""
    scores = token_rewards.sum(dim=-1)
    index = group_index(group_ids).to(scores.device)
    counts = torch.bincount(index).to(scores.dtype)[index]
    means, _ = group_mean_std(scores, index)
    advantages = (counts / (counts - 1).clamp(min=1) * (scores - means))[:, None] * adv_mask
    return advantages, advantages


def compute_reinforce(*, token_rewards, values, adv_mask, turn_ends, group_ids, state_ids,
                      config: AlgorithmConfig):
    """REINFORCE without a baseline: the trajectory's reward on every token. On rewards normalised by
    `agent_proxy.reward_normalization` this is ARPO (identity), BRPO (batch, mean_std) or GRPO (state, mean_std)."""
    advantages = token_rewards.sum(dim=-1, keepdim=True) * adv_mask
    return advantages, advantages


def compute_reinforce_plus_plus(*, token_rewards, values, adv_mask, turn_ends, group_ids, state_ids,
                                config: AlgorithmConfig):
    """REINFORCE++: the discounted reward-to-go over the masked tokens, whitened over the batch."""
    mask = adv_mask.bool()
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        running = torch.where(mask[:, t], token_rewards[:, t] + config.gamma * running, running)
        returns[:, t] = torch.where(mask[:, t], running, 0.0)
    return masked_whiten(returns, adv_mask), returns


def compute_gigpo(*, token_rewards, values, adv_mask, turn_ends, group_ids, state_ids, config: AlgorithmConfig):
    """GiGPO: an episode-level GRPO advantage plus `gigpo_step_weight` times a step-level one.

    Step level: each turn's discounted return R_k = r(e_k) + high_level_gamma * R_{k+1} is compared with the
    returns of all turns, in the same group, that answered the same state (anchor state): (R - mean) / (std
    + eps), or R - mean without std normalisation. A state met once has step advantage 0.
    """
    episode, _ = compute_grpo(token_rewards=token_rewards, values=values, adv_mask=adv_mask, turn_ends=turn_ends,
                              group_ids=group_ids, state_ids=state_ids, config=config)
    ends = turn_ends.bool()
    step_returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        running = torch.where(ends[:, t], token_rewards[:, t] + config.high_level_gamma * running, running)
        step_returns[:, t] = torch.where(ends[:, t], running, 0.0)

    rows, cols = ends.nonzero(as_tuple=True)  # (K,) each: one entry per turn of the batch
    groups = group_index(group_ids).numpy()[rows.cpu().numpy()]  # (K,) the turn's trajectory group
    keys = np.stack([groups, state_ids[rows, cols].cpu().numpy()], axis=1)  # (K, 2): (group, state answered)
    _, anchor = np.unique(keys, axis=0, return_inverse=True)  # (K,) turns with equal keys share an anchor
    turn_returns = step_returns[rows, cols]
    means, stds = group_mean_std(turn_returns, torch.as_tensor(anchor.reshape(-1), device=turn_returns.device))
    step_adv = turn_returns - means
    if config.norm_adv_by_std_in_grpo:
        step_adv = step_adv / (stds + EPS)
    at_ends = torch.zeros_like(token_rewards)
    at_ends[rows, cols] = step_adv

    step = torch.zeros_like(token_rewards)  # each turn's step advantage on all of its tokens
    carry = torch.zeros_like(running)
    for t in reversed(range(token_rewards.shape[1])):
        carry = torch.where(ends[:, t], at_ends[:, t], carry)
        step[:, t] = carry
    advantages = episode + config.gigpo_step_weight * step * adv_mask
    return advantages, advantages


@dataclass(frozen=True)
class AdvEstimator:
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    uses_critic: bool  # needs `values` from a critic, which is then trained on `returns`
    token_level: bool  # reads every token's reward (so a per-token KL penalty in the reward is meaningful)
    group_relative: bool  # compares trajectories of a group, so it needs group_size >= 2


ADV_ESTIMATORS: dict[str, AdvEstimator] = {
    "gae": AdvEstimator(compute_gae, uses_critic=True, token_level=True, group_relative=False),
    "bi_level_gae": AdvEstimator(compute_bi_level_gae, uses_critic=True, token_level=True, group_relative=False),
    "grpo": AdvEstimator(compute_grpo, uses_critic=False, token_level=False, group_relative=True),
    "rloo": AdvEstimator(compute_rloo, uses_critic=False, token_level=False, group_relative=True),
    "reinforce": AdvEstimator(compute_reinforce, uses_critic=False, token_level=False, group_relative=False),
    "reinforce_plus_plus": AdvEstimator(compute_reinforce_plus_plus, uses_critic=False, token_level=True,
                                        group_relative=False),
    "gigpo": AdvEstimator(compute_gigpo, uses_critic=False, token_level=False, group_relative=True),
}


# ---- reward normalisation (RAGEN's ARPO / BRPO / GRPO), on per-trajectory scores ------------------------
def _standardise(scores: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    means, stds = group_mean_std(scores, index)
    return torch.where(stds > EPS, (scores - means) / (stds + EPS), torch.zeros_like(scores))


REWARD_NORMALIZERS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "identity": lambda scores, index: scores,  # ARPO: raw rewards
    "mean": lambda scores, index: scores - group_mean_std(scores, index)[0],
    "mean_std": _standardise,  # a group whose rewards are all equal gets 0
    "asym_clip": lambda scores, index: _standardise(scores, index).clamp(min=-1.0, max=3.0),
}


def normalize_scores(scores: torch.Tensor, group_keys: np.ndarray, method: str) -> torch.Tensor:
    """Normalise each trajectory's reward (B,) within the groups given by `group_keys` (B,)."""
    return REWARD_NORMALIZERS[method](scores, group_index(group_keys).to(scores.device))


# ---- rollout filter (StarPO-S; RAGEN-2's strategies) -----------------------------------------------------
# The filter keeps whole start-state groups: each group gets one score (FILTER_METRICS), the groups are ranked
# by it (highest first for `largest`, lowest first for `smallest`) and a strategy (FILTER_STRATEGIES) says
# how many of the ranked groups to keep. Every strategy keeps a prefix of the ranking, so it returns a count.
ZERO_SCORE = 1e-10  # a group whose |score| is at most this says nothing: include_zero=False drops it first
# A share that the kept groups reach in exact arithmetic counts as reached: float sums fall short of it by ~1e-16
# (ten softmax weights of 0.1 add up to 0.8999999999999999 after nine), which would keep one group more
SHARE_SLACK = 1e-9


def _per_group(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Per-sample values (B,) that are equal within a group -> one per group (G,)."""
    return torch.zeros(int(index.max()) + 1, dtype=values.dtype).index_put_((index,), values)


def _group_mean(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return _per_group(group_mean_std(values, index)[0], index)


def _group_sum(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    zeros = torch.zeros(int(index.max()) + 1, dtype=torch.float64)
    return zeros.index_add(0, index, values.double()).to(values.dtype)


def _mean_negative_log_prob(rollout_log_probs: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B,): minus the mean log-prob of each trajectory's sampled tokens, a one-sample estimate of
    the per-token entropy of the distribution the engine sampled from. No extra forward pass: the rollout
    returns these log-probs anyway. 0 for a trajectory without generated tokens."""
    return -(rollout_log_probs * loss_mask).sum(-1) / loss_mask.sum(-1).clamp(min=1)


# metric(*, trajectory_rewards (B,), loss_mask (B, T), rollout_log_probs (B, T), index (B,)) -> scores (G,)
FILTER_METRICS: dict[str, Callable[..., torch.Tensor]] = {
    "reward_variance": lambda *, trajectory_rewards, loss_mask, rollout_log_probs, index: _per_group(
        group_mean_std(trajectory_rewards, index)[1], index),  # unbiased std, despite the name (RAGEN-2's)
    "reward": lambda *, trajectory_rewards, loss_mask, rollout_log_probs, index: _group_mean(
        trajectory_rewards, index),
    "reward_sum": lambda *, trajectory_rewards, loss_mask, rollout_log_probs, index: _group_sum(
        trajectory_rewards, index),
    "entropy": lambda *, trajectory_rewards, loss_mask, rollout_log_probs, index: _group_mean(
        _mean_negative_log_prob(rollout_log_probs, loss_mask.float()), index),
    "entropy_variance": lambda *, trajectory_rewards, loss_mask, rollout_log_probs, index: _per_group(
        group_mean_std(_mean_negative_log_prob(rollout_log_probs, loss_mask.float()), index)[1], index),  # std
    "length": lambda *, trajectory_rewards, loss_mask, rollout_log_probs, index: _group_mean(
        loss_mask.float().sum(-1), index),  # generated tokens per trajectory
}
FILTER_METRICS["reward_std"] = FILTER_METRICS["reward_variance"]  # RAGEN-2 accepts both names
FILTER_METRICS["entropy_std"] = FILTER_METRICS["entropy_variance"]


def _top_p_linear(ranked: torch.Tensor, value: float, largest: bool, selection_eps: float) -> int:
    """The fewest leading groups whose scores add up to `value` of the total (less `selection_eps`), taking no group
    with a score <= 0 (the ranking stops there); none when that share is never reached, or when it is <= 0 (no
    group is needed to reach it: RAGEN-2 returns an empty batch there, e.g. metric reward with negative rewards)."""
    threshold = value * ranked.sum() - selection_eps
    if threshold <= 0:
        return 0
    before_first_non_positive = (ranked > 0).cumprod(0).bool()
    reached = before_first_non_positive & (ranked.cumsum(0) >= threshold - SHARE_SLACK)
    return int(reached.int().argmax()) + 1 if reached.any() else 0


def _top_p_softmax(ranked: torch.Tensor, value: float, largest: bool, selection_eps: float) -> int:
    """The fewest leading groups that hold `value` of softmax(scores) (of -scores for `smallest`). Depends on the
    scores' scale: rewards of 0/1 give a near-uniform softmax, Sokoban's +10 a peaked one. `selection_eps` is
    linear's alone (RAGEN-2's)."""
    probs = torch.softmax(ranked if largest else -ranked, 0)  # descending, like `ranked`'s order
    share = torch.tensor([value - SHARE_SLACK], dtype=probs.dtype)
    return min(int(torch.searchsorted(probs.cumsum(0), share)) + 1, len(ranked))


TOP_P_PROB_MODES: dict[str, Callable[[torch.Tensor, float, bool, float], int]] = {
    "linear": _top_p_linear, "softmax": _top_p_softmax}


def top_k_count(value: float, num_groups: int) -> int:
    """top_k's groups: int(value * num_groups), at least 1 (the slack keeps 0.29 * 100 at 29)."""
    return max(1, int(value * num_groups + SHARE_SLACK))


def _top_p(ranked: torch.Tensor, *, value: float, largest: bool, num_groups: int, prob_mode: str,
           selection_eps: float) -> int:
    return len(ranked) if value >= 1 else TOP_P_PROB_MODES[prob_mode](ranked, value, largest, selection_eps)


def _min_p(ranked: torch.Tensor, *, value: float, largest: bool, num_groups: int, prob_mode: str,
           selection_eps: float) -> int:
    """largest: the scores >= value * max; smallest: the scores <= min / value (`ranked[0]` is the max or min)."""
    kept = ranked >= value * ranked[0] if largest else ranked <= ranked[0] / value
    return int(kept.sum())


# strategy(ranked (N,), *, value, largest, num_groups, prob_mode, selection_eps) -> how many of the N ranked
# groups to keep
FILTER_STRATEGIES: dict[str, Callable[..., int]] = {
    "top_p": _top_p,
    "top_k": lambda ranked, *, value, largest, num_groups, prob_mode, selection_eps: top_k_count(value, num_groups),
    "top_k_abs": lambda ranked, *, value, largest, num_groups, prob_mode, selection_eps: max(1, int(value)),
    "min_p": _min_p,
}


def select_groups(scores: torch.Tensor, *, strategy: str, value: float, largest: bool, include_zero: bool,
                  prob_mode: str, selection_eps: float = 0.01, fill: int = 1, multiple: int = 1) -> torch.Tensor:
    """Indices of the groups to keep, best first, from one score per group (G,).

    A NaN score (a group with a failed environment) is never kept. `include_zero=False` first drops the groups
    whose |score| <= ZERO_SCORE. The others, the candidates, are ranked (ties keep the earlier group), and the
    strategy keeps the first k of them (top_k: of all G groups; a strategy never keeps more than the candidates).

    The kept count is then rounded UP to a multiple of `fill` (the kept trajectories fill whole mini-batches)
    with the next-ranked candidates, or to all the candidates where there are too few for that (the last
    mini-batch is then short), and last DOWN to a multiple of `multiple` (every rank gets an equal share),
    possibly to none. Up, because every strategy's count is a least amount of signal (top_p: the fewest groups
    that hold the share) and the groups added are the next most informative; never beyond the candidates,
    because a zero-score group that include_zero=False excluded, or a failed one, must not come back as filler,
    and never down to whole mini-batches, because the lone informative group of a sparse step is the signal.
    A count of 0 (top_p's share never reached, no candidate, min_p on negative scores) stays 0: the trainer
    skips that step.
    """
    candidates = torch.nonzero(~scores.isnan() & (include_zero | (scores.abs() > ZERO_SCORE))).flatten()
    if len(candidates) == 0:
        return candidates
    candidate_scores = scores[candidates].double()
    order = torch.sort(candidate_scores, descending=largest, stable=True).indices
    ranked = candidate_scores[order]  # (N,)
    count = FILTER_STRATEGIES[strategy](ranked, value=value, largest=largest, num_groups=len(scores),
                                        prob_mode=prob_mode, selection_eps=selection_eps)
    count = min(math.ceil(count / fill) * fill, len(ranked))
    count = count // multiple * multiple
    return candidates[order[:count]]


# ---- policy and value losses ---------------------------------------------------------------------
def compute_policy_loss(*, log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                        loss_mask: torch.Tensor, clip_ratio_low: float, clip_ratio_high: float,
                        clip_ratio_c: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped PPO loss (B, T) with decoupled clip [1 - low, 1 + high] and dual clip.

    loss = max(-A r, -A clip(r)); for A < 0 additionally min(that, -A * clip_ratio_c), so a huge ratio on
    a bad token cannot produce an unbounded loss (Ye et al., 2020).
    """
    ratio = torch.exp((log_probs - old_log_probs).clamp(-20, 20))  # (B, T); exp(88) would overflow to inf
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_loss = torch.maximum(unclipped, clipped)
    dual = torch.minimum(clip_loss, -advantages * clip_ratio_c)
    loss = torch.where(advantages < 0, dual, clip_loss)
    metrics = {
        "pg_clipfrac": masked_mean((clipped > unclipped).float(), loss_mask),
        "pg_clipfrac_lower": masked_mean(((advantages < 0) & (dual < clip_loss)).float(), loss_mask),
        "ppo_kl": masked_mean(old_log_probs - log_probs, loss_mask),
    }
    return loss, metrics


# ---- rollout engine vs trainer ------------------------------------------------------------------
# The engine samples with its own copy of the weights (bf16, other kernels), so even right after a weight
# sync its log-probs of the sampled tokens differ from the trainer's: the samples are slightly off-policy.
def rollout_mismatch(*, old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
                     loss_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """How far the trainer's log-probs (B, T) are from the rollout engine's (B, T) on the `loss_mask` tokens:
    mean and max of |old - rollout|, and rollout_kl, the k3 estimate of KL(rollout || trainer) from the
    rollout's own samples: with r = p_trainer / p_rollout, E_rollout[r - 1 - log r] = KL(rollout || trainer)."""
    log_ratio = torch.where(loss_mask.bool(), old_log_probs - rollout_log_probs, 0.0).clamp(-20, 20)
    return {"rollout_logprob_diff_mean": masked_mean(log_ratio.abs(), loss_mask),
            "rollout_logprob_diff_max": log_ratio.abs().max(),
            "rollout_kl": masked_mean(torch.exp(log_ratio) - 1 - log_ratio, loss_mask)}


def truncated_is_weights(*, old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
                         cap: float) -> torch.Tensor:
    """Truncated importance weights (B, T), min(p_trainer / p_rollout, cap) per token, detached: the PPO loss
    is an expectation under the trainer's policy but the tokens were drawn by the engine's, so each token's
    loss is reweighted by their ratio; the cap bounds the variance a near-zero rollout probability would bring
    (truncated IS, as in Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
    training"). Exactly 1 wherever both log-probs are equal, e.g. 0 off the loss mask."""
    return torch.exp((old_log_probs - rollout_log_probs).clamp(max=math.log(cap))).detach()


def compute_value_loss(*, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       cliprange_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped value loss 0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clip(V - V_old)."""
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_loss, clipped_loss = (values - returns) ** 2, (clipped - returns) ** 2
    return 0.5 * torch.maximum(unclipped_loss, clipped_loss), (clipped_loss > unclipped_loss).float()


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float | None:
    """1 - Var(R - V) / Var(R) over the masked tokens: 1 is a perfect critic, 0 no better than a constant.

    None when the returns do not vary (beyond float32 rounding of their scale): the ratio is then undefined,
    and in float32 an ulp of spread would turn it into -1e14. Computed in float64."""
    values, returns, mask = values.double(), returns.double(), mask.double()
    var_returns = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    if var_returns <= CONSTANT_RELATIVE_VARIANCE * masked_mean(returns**2, mask):  # also catches 0 == 0
        return None
    residual = returns - values
    var_residual = masked_mean((residual - masked_mean(residual, mask)) ** 2, mask)
    return float(1 - var_residual / var_returns)


def entropy_from_log_probs(log_p: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position, from its log-probabilities: (..., V) -> (...)."""
    return -(log_p.exp() * log_p).sum(dim=-1)


# ---- loss aggregation ----------------------------------------------------------------------------
# Each mode returns (numerator, units): the loss is numerator / units. Splitting a mini-batch into
# micro-batches and dividing every micro-batch's numerator by the mini-batch's units gives exactly the
# gradient of the whole mini-batch, whatever the micro-batch size.
LOSS_AGG_MODES: dict[str, Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]] = {
    "token-mean": lambda values, mask: ((values * mask).sum(), mask.sum()),
    "seq-mean-token-sum": lambda values, mask: ((values * mask).sum(), (mask.sum(-1) > 0).sum().to(values.dtype)),
    "seq-mean-token-mean": lambda values, mask: (((values * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum(),
                                                 (mask.sum(-1) > 0).sum().to(values.dtype)),
}


def agg_loss(values: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    numerator, units = LOSS_AGG_MODES[mode](values, mask)
    return numerator / units.clamp(min=1)


# ---- KL ------------------------------------------------------------------------------------------
def _low_var_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    log_ratio = ref_log_probs - log_probs
    return (torch.exp(log_ratio) - log_ratio - 1).clamp(min=-10, max=10)


# Per-token estimators of KL(pi || pi_ref) from the sampled token's log-probs (Schulman's k1, k2, k3).
KL_PENALTIES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "kl": lambda log_probs, ref_log_probs: log_probs - ref_log_probs,
    "k1": lambda log_probs, ref_log_probs: log_probs - ref_log_probs,
    "abs": lambda log_probs, ref_log_probs: (log_probs - ref_log_probs).abs(),
    "mse": lambda log_probs, ref_log_probs: 0.5 * (log_probs - ref_log_probs) ** 2,
    "k2": lambda log_probs, ref_log_probs: 0.5 * (log_probs - ref_log_probs) ** 2,
    "low_var_kl": _low_var_kl,
    "k3": _low_var_kl,
}


class FixedKLController:
    def __init__(self, kl_coef: float, **_):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    """Ziegler et al. (2019): move the coefficient by at most 20% per `horizon` samples towards `target_kl`."""

    def __init__(self, kl_coef: float, target_kl: float, horizon: int):
        self.value, self.target, self.horizon = kl_coef, target_kl, horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        if not math.isfinite(current_kl):  # says nothing about the distance, and would make the coefficient NaN
            return
        error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value *= 1 + error * n_steps / self.horizon


KL_CONTROLLERS = {"fixed": FixedKLController, "adaptive": AdaptiveKLController}


def apply_kl_penalty(token_rewards: torch.Tensor, old_log_probs: torch.Tensor, ref_log_probs: torch.Tensor,
                     loss_mask: torch.Tensor, kl_penalty: str, kl_coef: float) -> tuple[torch.Tensor, float]:
    """r_t - kl_coef * KL_t on every generated token; also returns the batch's mean per-token KL."""
    kl = KL_PENALTIES[kl_penalty](old_log_probs, ref_log_probs) * loss_mask
    return token_rewards - kl_coef * kl, float(masked_mean(kl, loss_mask))


# ---- load balance --------------------------------------------------------------------------------
def balanced_order(lengths: list[int], n_parts: int) -> list[int]:
    """A permutation of the samples whose `n_parts` equal-count contiguous chunks (one per rank) carry
    nearly equal total tokens: longest first, each to the chunk with the fewest tokens that has room."""
    assert len(lengths) % n_parts == 0, "every rank gets the same number of samples"
    room = len(lengths) // n_parts
    parts: list[list[int]] = [[] for _ in range(n_parts)]
    tokens = [0] * n_parts
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        part = min((p for p in range(n_parts) if len(parts[p]) < room), key=lambda p: tokens[p])
        parts[part].append(i)
        tokens[part] += lengths[i]
    return [i for part in parts for i in sorted(part)]
