"""The start-up memory estimate: its counts match the real models, and a run that cannot fit stops."""

import pytest
from transformers import AutoModelForCausalLM

from ragen.config import ConfigError
from ragen.overrides import load_config
from ragen.train import check_memory
from verl.utils import memory
from verl.utils.lora import apply_lora


def test_parameter_counts_match_the_loaded_models(tiny_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    shape = memory.model_shape(tiny_model_path)
    assert shape.params == sum(p.numel() for p in model.parameters())  # tied weights counted once
    peft_model = apply_lora(model, rank=4, alpha=8, target_modules="all-linear")
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert memory.lora_params(tiny_model_path, 4, "all-linear") == trainable
    assert memory.lora_params(tiny_model_path, 4, ["q_proj"]) < trainable


def test_sharding_divides_the_model_states_but_not_the_rollout_copy():
    shape = memory.ModelShape(params=10**9, hidden=1024, layers=24, vocab=50000)
    kwargs = dict(trainable_fraction=1.0, reference=True, critic=True, rollout_bytes=2, micro_batch=1, tokens=1000,
                  generated_tokens=200, checkpointing=False)
    one = memory.estimate_per_rank(shape, world_size=4, sharded=False, **kwargs)
    four = memory.estimate_per_rank(shape, world_size=4, sharded=True, **kwargs)
    assert one["actor weights + optimizer"] == pytest.approx(16e9 / memory.GIB)
    assert four["actor weights + optimizer"] == pytest.approx(one["actor weights + optimizer"] / 4)
    assert four["rollout copy"] == one["rollout copy"] == pytest.approx(2e9 / memory.GIB)
    checkpointed = memory.estimate_per_rank(shape, world_size=4, sharded=True, **{**kwargs, "checkpointing": True})
    assert checkpointed["activations of one micro-batch"] < four["activations of one micro-batch"]
    longer_replies = memory.estimate_per_rank(shape, world_size=4, sharded=True, **{**kwargs, "generated_tokens": 400})
    assert longer_replies["activations of one micro-batch"] > four["activations of one micro-batch"]


def test_a_run_that_cannot_fit_stops_with_the_remedies(tiny_model_path, capsys):
    cfg = load_config("sokoban", [f"model_path={tiny_model_path}"])
    check_memory(cfg, ranks=1, use_critic=True, use_reference=False)
    assert "memory per rank (estimate)" in capsys.readouterr().out
    huge = load_config("sokoban", [f"model_path={tiny_model_path}",
                                   "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4096",
                                   "actor_rollout_ref.rollout.response_length=8192"])
    with pytest.raises(ConfigError, match="enable_gradient_checkpointing"):
        check_memory(huge, ranks=1, use_critic=True, use_reference=False)
