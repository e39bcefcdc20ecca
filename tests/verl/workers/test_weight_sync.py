"""The weight-sync check on the actor (tiny Llama, local worker): every sync of the torch and hf engines passes,
with and without LoRA, in fp32 and bf16; a sync that skips a tensor or loads the unmerged base weights stops
the update, naming the tensors."""

from dataclasses import replace

import pytest

from tests.verl.workers.test_actor_critic import actor_config, make_batch
from verl.single_controller import LocalWorkerGroup
from verl.trainer.config import LoraConfig
from verl.utils.fingerprint import WeightSyncError
from verl.utils.model import load_causal_lm
from verl.workers.actor import ActorRolloutRefWorker
from verl.workers.rollout import HFRollout

SKIPPED = "model.layers.1.mlp.down_proj.weight"


def actor(model_path: str, engine: str = "torch", dtype: str = "float32", lora_rank: int = 0,
          check: bool = True) -> LocalWorkerGroup:
    config = actor_config(model_path)
    config.rollout = replace(config.rollout, name=engine, dtype=dtype, check_weight_sync=check)
    group = LocalWorkerGroup(ActorRolloutRefWorker, config, lora=LoraConfig(rank=lora_rank, alpha=8))
    group.init_model()  # the first sync, checked
    return group


@pytest.mark.parametrize("engine, dtype, lora_rank", [("torch", "float32", 0), ("hf", "bfloat16", 0),
                                                      ("torch", "bfloat16", 4), ("hf", "float32", 4)])
def test_every_sync_passes_the_check(tiny_model_path, tokenizer, engine, dtype, lora_rank):
    group = actor(tiny_model_path, engine, dtype, lora_rank)
    group.update_actor(make_batch(tokenizer))  # with lr 1e-3 every weight (every LoRA B) moves: synced, checked
    group.worker._sync_rollout()  # and what a checkpoint load ends with


def test_a_sync_that_skips_a_tensor_stops_the_update(tiny_model_path, tokenizer, monkeypatch):
    def skipping_sync(engine, state_dict):
        engine.model.load_state_dict({k: v for k, v in state_dict.items() if k != SKIPPED}, strict=False)

    monkeypatch.setattr(HFRollout, "sync_weights", skipping_sync)
    group = actor(tiny_model_path)  # the initial sync leaves the engine's own copy of the same weights: no error
    with pytest.raises(WeightSyncError, match=rf"\(1 of 21 tensors differ\): {SKIPPED}: trainer sum"):
        group.update_actor(make_batch(tokenizer))

    unchecked = actor(tiny_model_path, check=False)
    unchecked.update_actor(make_batch(tokenizer))  # the same broken sync goes unnoticed with the check off


def test_a_sync_of_the_unmerged_base_weights_stops_the_update(tiny_model_path, tokenizer, monkeypatch):
    """A LoRA run whose engine never receives the adapter: it keeps sampling from the base model."""
    base = load_causal_lm(tiny_model_path, "float32").state_dict()
    monkeypatch.setattr(HFRollout, "sync_weights", lambda engine, state_dict: engine.model.load_state_dict(base))
    group = actor(tiny_model_path, lora_rank=4)  # a fresh adapter is zero: merged weights are the base weights
    with pytest.raises(WeightSyncError) as error:
        group.update_actor(make_batch(tokenizer))
    message = str(error.value)
    # all-linear LoRA: the 7 projections of each of the 2 layers differ; embeddings and norms do not train
    assert "(14 of 21 tensors differ)" in message and "model.layers.0.self_attn.q_proj.weight: trainer" in message
    assert "norm" not in message and "embed_tokens" not in message
