"""Learning regression: a short bandit run on the bundled SmolLM2-135M must lift validation success well above
the untrained model's. Plumbing tests (masks, alignment, sync) pass on a policy that does not learn; this one
fails when a change stops learning: a flipped advantage sign, a mask off by one, log-probs at the wrong
temperature, weights that never reach the rollout engine.

The bandit here is made so that only learning can move the policy: the risky arm pays 1 with probability 0.9
(the recipe: 0.25), the safe arm pays 0 and a malformed reply costs nothing (the recipe: 0.1 and -0.1). So
the only reward is a risky pull that paid; a batch without one has equal rewards and takes no step
(zero-variance skip), and every step that is taken pushes towards the risky arm. With the recipe's
rewards, the format is learned first and pushes whichever arm is sampled more, mostly the safe one; over 6
steps of 16 trajectories that made the outcome a coin toss (a change of floating-point summation order alone
turned 0.469 -> 1.000 into 0.469 -> 0.000, and with lr 2e-5 without warm-up 3 of 4 seeds learned). With
these rewards, 4 of 4 training seeds reached 1.000 (the default, 1, 2 and 4; each ~8 min on one core). No
learning-rate warm-up: over 6 steps it would average 60 % of the rate.
`scripts/reproduce.py bandit` measures the recipe itself. Sampling is seeded.
"""

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).parents[1]
STEPS = 6


def test_a_short_bandit_run_learns_the_better_arm(tmp_path):
    command = ["bash", str(REPO / "train.sh"), "bandit", "trainer.backend=local",
               f"trainer.total_training_steps={STEPS}", f"trainer.test_freq={STEPS}", "trainer.save_freq=-1",
               "trainer.logger=[jsonl]",
               f"trainer.default_local_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'hydra'}",
               "logging.log_images=false", "trainer.rollout_data_dir=null",
               "es_manager.train.env_groups=4", "es_manager.train.group_size=4",
               "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.actor.optim.lr=2e-5",
               "actor_rollout_ref.actor.optim.lr_warmup_steps=0", "es_manager.format_penalty=0.0",
               "es_manager.val.env_groups=32", "es_manager.val.env_configs.tags=[Bandit]",
               "+custom_envs.Bandit.env_config.risky_prob=0.9", "+custom_envs.Bandit.env_config.safe_reward=0.0"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    before, after = rows[0]["val-env/Bandit/success"], rows[-1]["val-env/Bandit/success"]
    assert rows[0]["step"] == 0 and rows[-1]["step"] == STEPS
    assert after >= 0.9 and after >= before + 0.3, f"validation success {before:.3f} -> {after:.3f}"
    # the policy learned from the rewards it was given, in the training batches too
    assert rows[-1]["rollout/reward_mean"] > rows[1]["rollout/reward_mean"]
