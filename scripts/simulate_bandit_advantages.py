"""Which group advantage learns the bandit's better arm? A two-logit simulation, no model: `python
scripts/simulate_bandit_advantages.py`.

The policy picks the risky arm (pays 1 with probability 0.25, else 0) with p = sigmoid(theta), else the safe
arm (pays `--safe-reward`, by default the Bandit environment's). Each step samples `groups` x `group_size`
pulls and follows the policy gradient of advantage-weighted log-probs, with advantages centred on the group
mean, divided by the group's reward std (GRPO) or not (RLOO / Dr. GRPO), and with the payout drawn once per
group (shared) or per pull. It prints the final p(risky), averaged over seeds: the measurement behind the
bandit recipe's choice of RLOO.
"""

import argparse

import numpy as np

from ragen.envs.bandit import BanditConfig


def final_p_risky(shared_payout: bool, divide_by_std: bool, steps: int, groups: int, group_size: int, lr: float,
                  safe_reward: float, seed: int) -> float:
    rng = np.random.default_rng(seed)
    theta = 0.0  # logit of the risky arm against the safe one
    for _ in range(steps):
        gradient = 0.0
        for _ in range(groups):
            p = 1 / (1 + np.exp(-theta))
            risky = rng.random(group_size) < p
            pays = np.full(group_size, rng.random() < 0.25) if shared_payout else rng.random(group_size) < 0.25
            rewards = np.where(risky, pays * 1.0, safe_reward)
            if rewards.std() == 0:
                continue
            advantages = rewards - rewards.mean()
            if divide_by_std:
                advantages = advantages / (rewards.std(ddof=1) + 1e-6)
            gradient += (advantages * (risky - p)).sum()  # d log pi / d theta = 1[risky] - p
        theta += lr * gradient / (groups * group_size)
    return float(1 / (1 + np.exp(-theta)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--safe-reward", type=float, default=BanditConfig.safe_reward)
    args = parser.parse_args()
    for shared in (True, False):
        for divide in (True, False):
            finals = [final_p_risky(shared, divide, args.steps, args.groups, args.group_size, args.lr,
                                     args.safe_reward, seed)
                      for seed in range(args.seeds)]
            print(f"payout {'shared by the group' if shared else 'drawn per pull':<20} "
                  f"{'GRPO (divide by std)' if divide else 'RLOO / Dr. GRPO (no std)':<25} final p(risky): mean "
                  f"{np.mean(finals):.2f}, above 0.9 in {sum(p > 0.9 for p in finals)}/{len(finals)} seeds")


if __name__ == "__main__":
    main()
