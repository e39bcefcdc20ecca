"""The LR schedules, and gradient checkpointing changing memory, not the update."""

import math

import pytest

from tests.verl.workers.test_actor_critic import actor_config, grads, leave_stale_gradients, make_batch
from verl.single_controller import LocalWorkerGroup
from verl.trainer.config import OptimConfig
from verl.workers.actor import ActorRolloutRefWorker
from verl.workers.ppo_update import lr_factor


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
