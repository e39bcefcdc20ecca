"""The LR schedules, length-sorted micro-batches without padding, gradient checkpointing changing memory,
not the update, and a non-finite loss skipping its optimizer step (and the schedule)."""

import math

import pytest
import torch

from tests.verl.workers.test_actor_critic import actor_config, grads, leave_stale_gradients, make_batch, params
from verl.single_controller import LocalWorkerGroup
from verl.trainer.config import OptimConfig
from verl.workers.actor import ActorRolloutRefWorker
from verl.workers.ppo_update import lr_factor, micro_batches, score_micro_batches


def test_warm_up_then_constant_or_cosine():
    constant = OptimConfig(lr_warmup_steps=4, total_training_steps=10)
    assert [lr_factor(step, constant) for step in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cosine = OptimConfig(lr_scheduler="cosine", lr_warmup_steps=2, min_lr_ratio=0.1, total_training_steps=12)
    assert lr_factor(1, cosine) == 1.0 and lr_factor(2, cosine) == 1.0  # warm-up done, decay starts
    assert lr_factor(7, cosine) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))  # half way
    assert lr_factor(12, cosine) == pytest.approx(0.1) and lr_factor(50, cosine) == pytest.approx(0.1)


def test_gradient_checkpointing_gives_the_same_gradient(tiny_model_path, tokenizer):
    groups = []
    for checkpointing in (False, True):
        config = actor_config(tiny_model_path, grad_clip=1e9)
        config.model.enable_gradient_checkpointing = checkpointing
        group = LocalWorkerGroup(ActorRolloutRefWorker, config)
        group.init_model()
        groups.append(group)
    batch = make_batch(tokenizer)
    batch = batch.union(groups[0].compute_log_prob(batch))
    for group in groups:
        leave_stale_gradients(group)
        group.update_actor(batch)
    plain, checkpointed = grads(groups[0]), grads(groups[1])
    for key in plain:
        assert (checkpointed[key] - plain[key]).abs().max() <= 1e-5 * plain[key].abs().max() + 1e-9, key


def test_micro_batches_take_every_row_once_longest_first_without_padding(tokenizer):
    batch = make_batch(tokenizer)  # four right-padded rows of lengths 12, 7, 10, 5
    lengths = batch.batch["attention_mask"].sum(dim=1)
    micros = micro_batches(batch, 3)
    assert [len(m) for m in micros] == [3, 1]
    assert [m.batch["input_ids"].shape[1] for m in micros] == [12, 5]  # each cut to its longest row
    rows = [tuple(row[row != tokenizer.pad_token_id].tolist()) for m in micros for row in m.batch["input_ids"]]
    expected = [tuple(batch.batch["input_ids"][i, :n].tolist()) for i, n in
                sorted(enumerate(lengths.tolist()), key=lambda item: -item[1])]
    assert rows == expected
    for m in micros:  # every per-token tensor is cut alike, nothing a row attends to is lost
        assert {v.shape[1] for v in m.batch.values()} == {m.batch["input_ids"].shape[1]}
    assert sum(m.batch["loss_mask"].sum() for m in micros) == batch.batch["loss_mask"].sum()


def test_scores_come_back_in_the_batch_order_and_zero_on_the_columns_cut(tokenizer):
    batch = make_batch(tokenizer)  # micro-batches of 3: rows 0, 2, 1 (12 columns), then row 3 alone (5)
    scores = score_micro_batches(batch, 3, torch.device("cpu"), lambda micro: micro["input_ids"].float() + 1)
    mask = batch.batch["attention_mask"].bool()
    assert torch.equal(scores[mask], batch.batch["input_ids"][mask].float() + 1)
    assert torch.equal(scores[3, 5:], torch.zeros(7))


@pytest.mark.parametrize("nan_rows, skipped", [([0, 1, 2, 3], 2), ([2, 3], 1)])
def test_a_non_finite_loss_skips_its_step_and_an_update_without_steps_keeps_the_lr(tiny_model_path, tokenizer,
                                                                                   nan_rows, skipped):
    group = LocalWorkerGroup(ActorRolloutRefWorker, actor_config(
        tiny_model_path, ppo_mini_batch_size=2, optim=OptimConfig(lr=1e-3, lr_warmup_steps=4)))
    group.init_model()
    batch = make_batch(tokenizer)  # two mini-batches of two rows: rows 0, 1 then rows 2, 3
    batch.batch["advantages"][nan_rows] = float("nan")
    before = params(group)
    metrics = group.update_actor(batch)
    assert metrics["actor/nonfinite_skipped_steps"] == skipped
    assert metrics["actor/lr"] == 0.25e-3  # the first warm-up step's rate
    moved = any(not torch.equal(before[k], v) for k, v in params(group).items())
    assert all(torch.isfinite(v).all() for v in params(group).values())
    scheduler = group.worker.lr_scheduler
    if skipped == 2:  # no step taken: neither the weights nor the schedule moved
        assert not moved and scheduler.last_epoch == 0 and group.worker.optimizer.param_groups[0]["lr"] == 0.25e-3
    else:
        assert moved and scheduler.last_epoch == 1 and group.worker.optimizer.param_groups[0]["lr"] == 0.5e-3
