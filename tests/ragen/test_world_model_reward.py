"""VAGEN's world-model reward: the credit of a written state, and the reward it adds in the rollout loop."""

import re

import pytest

from ragen.agent_proxy import AgentProxy
from ragen.config import AgentProxyConfig, CustomEnvConfig, EnvGroupsConfig, EnvMixConfig, WorldModelRewardConfig
from ragen.context_manager import ContextManager
from ragen.env_state_manager import EnvStateManager
from ragen.world_model_reward import state_credit, turn_credits
from verl.protocol import DataProto
from verl.workers.rollout import SamplingParams

COORD = ("Board size: 4 rows x 4 cols (zero-indexed).\nTargets: (1, 2)\nBoxes: (2, 2)\nPlayer: (2, 1)\nGrid:\n"
         "# # # #\n# _ O #\n# P X #\n# # # #")
GRID = "####\n#_O#\n#PX#\n####"


def test_exact_credit_is_the_whole_state_or_nothing():
    assert state_credit(f"\n{COORD}\n", COORD, "exact") == 1.0  # outer whitespace ignored
    assert state_credit(COORD.replace("Player: (2, 1)", "Player: (2, 0)"), COORD, "exact") == 0.0
    assert state_credit(None, COORD, "exact") == state_credit(None, COORD, "partial") == 0.0  # no span


def test_partial_credit_counts_the_coordinate_labels_right():
    assert state_credit(COORD, COORD, "partial") == 1.0
    moved = COORD.replace("Player: (2, 1)", "Player: (1, 1)")
    assert state_credit(moved, COORD, "partial") == pytest.approx(2 / 3)  # Targets, Boxes right; Player wrong
    # the grid is not scored where coordinates are: a wrong grid with the right coordinates earns full credit
    assert state_credit(COORD.replace("# P X #", "# _ X #"), COORD, "partial") == 1.0
    # a label the model adds, or leaves out, is wrong
    assert state_credit(COORD + "\nHoles: (0, 0)", COORD, "partial") == pytest.approx(3 / 4)
    assert state_credit("Targets: (1, 2)\nBoxes: (2, 2)", COORD, "partial") == pytest.approx(2 / 3)
    assert state_credit("I am not sure where anything is.", COORD, "partial") == 0.0


def test_every_coordinate_label_an_environment_writes_is_scored():
    coord_only = "Inner walls: (1, 1)\nTargets: (1, 2)\nBoxes: (2, 2)\nPlayer: (2, 1)"  # Sokoban's `coord` format
    assert state_credit(coord_only.replace("(1, 1)", "(2, 3)"), coord_only, "partial") == pytest.approx(3 / 4)
    lake = "Start: (0, 0)\nGoal: (3, 3)\nPlayer: (1, 0)\nHoles: (1, 1), (2, 3)\nGrid:\nS _ _ _\nP H _ _\n_ _ _ H\n_ _ _ G"
    assert state_credit(lake.replace("Holes: (1, 1), (2, 3)", "Holes: (1, 1)"), lake, "partial") == pytest.approx(3 / 4)


def test_partial_credit_of_a_plain_grid_is_the_share_of_cells_right():
    assert state_credit(GRID, GRID, "partial") == 1.0
    assert state_credit("# # # #\n# _ O #\n# P X #\n# # # #", GRID, "partial") == 1.0  # separators do not matter
    assert state_credit(GRID.replace("P", "_"), GRID, "partial") == pytest.approx(15 / 16)
    assert state_credit("####\n#_O#", GRID, "partial") == pytest.approx(8 / 16)  # rows left out are wrong
    assert state_credit(GRID + "\n####", GRID, "partial") == pytest.approx(16 / 20)  # and rows added cost too


def test_turn_credits_score_the_observation_against_the_state_and_the_prediction_against_the_next():
    after = COORD.replace("Player: (2, 1)", "Player: (1, 1)")
    reply = f"<think><observation>{COORD}</observation>Up.<prediction>{COORD}</prediction></think><answer>Up</answer>"
    assert turn_credits(reply, COORD, after, "exact") == {"observation": 1.0, "prediction": 0.0}
    assert turn_credits(reply, COORD, after, "partial") == {"observation": 1.0, "prediction": pytest.approx(2 / 3)}
    assert turn_credits("<think>Up</think><answer>Up</answer>", COORD, after, "partial") == {
        "observation": 0.0, "prediction": 0.0}


class CopyingPolicy:
    """Writes the state it is shown into <observation> (read back from the prompt), a blank prediction, and Up."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        ids = []
        for prompt in prompts.non_tensor_batch["prompt_ids"]:
            state = re.findall(r"State:\n(.*?)\nYou have", self.tokenizer.decode(prompt), re.DOTALL)[-1]
            reply = f"<observation>{state}</observation>Up.<prediction></prediction></think><answer>Up</answer>"
            ids.append(self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id])
        return DataProto(non_tensor_batch={"response_ids": ids, "response_log_probs": [[-1.0] * len(i) for i in ids]})


def rollout(tokenizer, world_model_reward: WorldModelRewardConfig):
    config = AgentProxyConfig(max_turn=3, max_actions_per_turn=1, reply_format="world_model",
                              world_model_reward=world_model_reward)
    envs = EnvStateManager(EnvGroupsConfig(env_groups=2, group_size=2, env_configs=EnvMixConfig(["Sokoban"], [2])),
                           {"Sokoban": CustomEnvConfig(env_type="sokoban", max_actions_per_traj=10)}, seed=0)
    context = ContextManager.for_envs(tokenizer, config, envs.env_per_tag(), [tokenizer.eos_token_id])
    return AgentProxy(config, SamplingParams(max_new_tokens=600), -0.1, 0, CopyingPolicy(tokenizer), envs,
                      context).rollout(step=1)


def test_the_world_model_reward_adds_each_turns_credit_and_is_logged_apart_from_the_task_reward(tokenizer):
    plain = rollout(tokenizer, WorldModelRewardConfig())
    scored = rollout(tokenizer, WorldModelRewardConfig(observation=0.5, prediction=2.0, credit="exact"))
    turns = [len(record["turns"]) for record in scored.records]
    assert turns == [len(record["turns"]) for record in plain.records]  # the same play: the reward changes no move
    # and no prompt: the next state's `Reward:` line shows the task's reward, as the warm-start data does
    assert scored.batch.batch["input_ids"].tolist() == plain.batch.batch["input_ids"].tolist()
    gained = scored.batch.batch["trajectory_rewards"] - plain.batch.batch["trajectory_rewards"]
    assert gained.tolist() == pytest.approx([0.5 * n for n in turns])  # observation right, prediction blank
    assert all(turn["world_model"] == {"observation": 1.0, "prediction": 0.0, "reward": 0.5}
               for record in scored.records for turn in record["turns"])
    metrics = scored.metrics
    assert metrics["rollout/world_model/observation_credit"] == 1.0
    assert metrics["rollout/world_model/prediction_credit"] == 0.0
    assert metrics["rollout/world_model/reward_mean"] == pytest.approx(0.5 * sum(turns) / len(turns))
    assert metrics["rollout/task_reward_mean"] == pytest.approx(plain.metrics["rollout/reward_mean"])
    assert "rollout/world_model/reward_mean" not in plain.metrics and "world_model" not in plain.records[0]["turns"][0]
