"""Template collapse (verl/trainer/collapse.py): the mutual-information estimate on hand-computed score matrices,
the cross-scoring rows of a hand-made batch token by token, and the trainer stage over a scripted policy."""

import math

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.collapse import collapse_metrics, cross_scoring_pairs, repeat_to_multiple, score_matrix
from verl.trainer.config import AlgorithmConfig, RolloutConfig, TrainerConfig
from verl.trainer.ppo_trainer import PPOTrainer
from verl.utils.tracking import Tracking


@pytest.mark.parametrize("num_inputs", [2, 3, 5])
def test_replies_that_name_their_input_reach_log_m_and_full_retrieval(num_inputs):
    own_input = np.repeat(np.arange(num_inputs), 2)  # two replies per input
    scores = torch.full((num_inputs, len(own_input)), -1e4)  # (M, N): any other input makes a reply impossible
    scores[own_input, np.arange(len(own_input))] = -3.0
    metrics = collapse_metrics(scores, own_input)
    assert metrics["collapse/mi"] == pytest.approx(math.log(num_inputs))
    assert metrics["collapse/mi_ceiling"] == pytest.approx(math.log(num_inputs))
    assert metrics["collapse/retrieval_acc"] == 1.0
    assert metrics["collapse/retrieval_chance"] == pytest.approx(1 / num_inputs)


@pytest.mark.parametrize("num_inputs", [2, 4])
def test_input_independent_replies_carry_no_information_and_retrieve_at_chance(num_inputs):
    own_input = np.array([*range(num_inputs), *[num_inputs - 1] * 3])  # unbalanced: ties must not favour input 0
    reply_scores = -torch.arange(1.0, len(own_input) + 1)  # each reply as likely under every input
    metrics = collapse_metrics(reply_scores.expand(num_inputs, -1), own_input)
    assert metrics["collapse/mi"] == pytest.approx(0.0, abs=1e-12)
    assert metrics["collapse/retrieval_acc"] == pytest.approx(1 / num_inputs)


def test_a_partly_dependent_matrix_matches_the_hand_computation():
    # reply 0 (input 0): p = 0.8 under x0, 0.2 under x1; reply 1 (input 1): p = 0.4 under x0, 0.6 under x1;
    # reply 2 (input 1): p = 0.3 under x0, 0.1 under x1: retrieved wrongly
    p = torch.tensor([[0.8, 0.4, 0.3], [0.2, 0.6, 0.1]])
    metrics = collapse_metrics(p.log(), np.array([0, 1, 1]))
    expected = (math.log(0.8 / 0.5) + math.log(0.6 / 0.5) + math.log(0.1 / 0.2)) / 3
    assert metrics["collapse/mi"] == pytest.approx(expected)
    assert metrics["collapse/retrieval_acc"] == pytest.approx(2 / 3)


def trajectory_batch(rows: list[tuple[list[int], list[int], list[int]]], group_ids: list[int]) -> DataProto:
    """Right-padded rows from (input_ids, loss_mask, turn_ids), as the context manager makes them."""
    width = max(len(ids) for ids, _, _ in rows)
    input_ids, loss_mask = torch.zeros(len(rows), width, dtype=torch.long), torch.zeros(len(rows), width)
    turn_ids = torch.full((len(rows), width), -1)
    for b, (ids, mask, turns) in enumerate(rows):
        input_ids[b, :len(ids)], loss_mask[b, :len(ids)], turn_ids[b, :len(ids)] = (
            torch.tensor(ids), torch.tensor(mask, dtype=torch.float32), torch.tensor(turns))
    return DataProto(batch={"input_ids": input_ids, "loss_mask": loss_mask, "turn_ids": turn_ids,
                            "attention_mask": (turn_ids >= 0).long()},
                     non_tensor_batch={"group_ids": np.array(group_ids)})


# group 7: prompt [11, 12], three trajectories, the first of two turns; group 3: the same prompt (not a new
# input); group 5: prompt [14, 15, 16]
BATCH = trajectory_batch([
    ([11, 12, 21, 22, 13, 23], [0, 0, 1, 1, 0, 1], [0, 0, 0, 0, 1, 1]),
    ([11, 12, 24], [0, 0, 1], [0, 0, 0]),
    ([11, 12, 25, 26], [0, 0, 1, 1], [0, 0, 0, 0]),
    ([11, 12, 29], [0, 0, 1], [0, 0, 0]),
    ([14, 15, 16, 28], [0, 0, 0, 1], [0, 0, 0, 0]),
], group_ids=[7, 7, 7, 3, 5])


def test_pairs_cross_every_distinct_first_prompt_with_every_first_reply():
    pairs, own_input = cross_scoring_pairs(BATCH, inputs=4, replies=2)
    assert own_input.tolist() == [0, 0, 1]  # replies [21, 22] and [24] of group 7, [28] of group 5
    assert pairs.batch["input_ids"].tolist() == [
        [11, 12, 21, 22, 0], [11, 12, 24, 0, 0], [11, 12, 28, 0, 0],
        [14, 15, 16, 21, 22], [14, 15, 16, 24, 0], [14, 15, 16, 28, 0]]
    assert pairs.batch["loss_mask"].tolist() == [
        [0, 0, 1, 1, 0], [0, 0, 1, 0, 0], [0, 0, 1, 0, 0],
        [0, 0, 0, 1, 1], [0, 0, 0, 1, 0], [0, 0, 0, 1, 0]]
    assert pairs.batch["attention_mask"].tolist() == [
        [1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 1, 0]]
    assert pairs.batch["position_ids"].tolist() == [
        [0, 1, 2, 3, 0], [0, 1, 2, 0, 0], [0, 1, 2, 0, 0],
        [0, 1, 2, 3, 4], [0, 1, 2, 3, 0], [0, 1, 2, 3, 0]]


def test_inputs_and_replies_are_capped_and_one_input_gives_no_pairs():
    pairs, own_input = cross_scoring_pairs(BATCH, inputs=2, replies=1)
    assert own_input.tolist() == [0, 1]
    assert pairs.batch["input_ids"].tolist() == [[11, 12, 21, 22, 0], [11, 12, 28, 0, 0],
                                                 [14, 15, 16, 21, 22], [14, 15, 16, 28, 0]]
    assert cross_scoring_pairs(BATCH[:4], inputs=4, replies=2) is None  # groups 7 and 3 share their prompt


def test_rows_are_repeated_to_a_multiple_of_the_ranks():
    data = DataProto(batch={"input_ids": torch.arange(5)[:, None]})
    assert repeat_to_multiple(data, 2).batch["input_ids"].flatten().tolist() == [0, 1, 2, 3, 4, 4]
    assert repeat_to_multiple(data, 5).batch["input_ids"].flatten().tolist() == [0, 1, 2, 3, 4]
    assert len(repeat_to_multiple(data, 4)) == 8


def test_score_matrix_sums_the_reply_tokens_input_major():
    log_probs = torch.tensor([[0.0, -1, -2], [0, -3, 0], [0, -4, -5], [0, -6, 0]])  # (M * N, T), M = N = 2
    loss_mask = torch.tensor([[0.0, 1, 1], [0, 1, 0], [0, 1, 1], [0, 1, 0]])
    assert score_matrix(log_probs, loss_mask, num_replies=2).tolist() == [[-3, -3], [-9, -6]]


class ScriptedPolicy:
    """Two ranks that score a reply token at log p = 0 when it equals its row's first prompt token + 10 (the
    reply was written for that prompt) and -20 otherwise; checks that every rank gets an equal share."""

    world_size = 2

    def __init__(self):
        self.calls = []

    def compute_log_prob(self, data: DataProto) -> DataProto:
        self.calls.append(len(data))
        assert len(data) % self.world_size == 0, "ranks would run different numbers of forwards"
        ids = data.batch["input_ids"]
        matches = ids == (ids[:, :1] + 10)
        return DataProto(batch={"old_log_probs": torch.where(matches, 0.0, -20.0) * data.batch["loss_mask"]})


@pytest.mark.parametrize("inputs, expected_rows", [(3, 10), (0, None)])  # 3 inputs x 3 replies = 9 rows, padded
def test_measure_collapse_scores_the_pairs_with_the_policy(tmp_path, inputs, expected_rows):
    batch = trajectory_batch([([1, 2, 11], [0, 0, 1], [0, 0, 0]), ([3, 2, 13], [0, 0, 1], [0, 0, 0]),
                              ([4, 2, 14], [0, 0, 1], [0, 0, 0]), ([4, 2, 14, 14], [0, 0, 1, 1], [0, 0, 0, 0])],
                             group_ids=[0, 1, 2, 2])
    policy = ScriptedPolicy()
    config = TrainerConfig(collapse_mi_inputs=inputs, collapse_mi_replies=1, default_local_dir=str(tmp_path))
    trainer = PPOTrainer(config, AlgorithmConfig(), RolloutConfig(), policy, None, agent=None,
                         tracker=Tracking([], str(tmp_path)), run_config={})
    metrics = trainer.measure_collapse(batch)
    if expected_rows is None:
        assert metrics == {} and policy.calls == []
        return
    assert policy.calls == [expected_rows]
    assert metrics["collapse/mi"] == pytest.approx(math.log(3), abs=1e-6)
    assert metrics["collapse/retrieval_acc"] == 1.0 and metrics["collapse/retrieval_chance"] == pytest.approx(1 / 3)
