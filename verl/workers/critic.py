"""CriticWorker: the value model V(tokens < t), trained on the returns of GAE with a clipped value loss.

Values are aligned like log-probs: `values[:, t]` is the value of the prefix before token t, read from the
value head at position t - 1; column 0 is zero. They are trained only where `adv_mask` is 1. With a context
window a value sees what the rollout engine's prompt held, as the actor's log-probs do (`forward_inputs`).
"""

from dataclasses import replace

import torch

from verl.protocol import DataProto
from verl.single_controller import DATA_PARALLEL, ONE_TO_ALL, Worker, register
from verl.trainer.config import CriticConfig
from verl.trainer.core_algos import compute_value_loss, masked_mean
from verl.utils.checkpoint import load_train_state, save_train_state
from verl.utils.fsdp import full_state_dict, load_full_state_dict, reshard, shard_model
from verl.utils.model import (attention_implementation, enable_activation_checkpointing, forward_inputs,
                              load_value_model, read_weights, resolve_dtype)
from verl.workers.ppo_update import make_optimizer, ppo_update, score_micro_batches


class CriticWorker(Worker):
    def __init__(self, config: CriticConfig, *, rank: int, world_size: int, init_method: str | None,
                 verbose: bool = True):
        super().__init__(rank, world_size, init_method, verbose)
        self.config = replace(config, model=replace(config.model, dtype=resolve_dtype(config.model.dtype)))

    @register(ONE_TO_ALL)
    def init_model(self) -> None:
        cfg = self.config
        self.model = load_value_model(cfg.model.path, attention_implementation(cfg.model.dtype),
                                      load_report=self.verbose).to(self.device)
        self.model.config.use_cache = False
        if cfg.model.enable_gradient_checkpointing:
            enable_activation_checkpointing(self.model)
        shard_model(self.model, param_dtype=cfg.model.dtype, cpu_offload=cfg.model.cpu_offload)
        self.optimizer, self.lr_scheduler = make_optimizer(self.model, cfg.optim)

    @register(DATA_PARALLEL)
    @torch.no_grad()
    def compute_values(self, data: DataProto) -> DataProto:
        self.model.eval()
        values = score_micro_batches(data, self.config.forward_micro_batch_size_per_gpu, self.device, self._forward)
        reshard(self.model)  # no backward follows: free the gathered weights
        return DataProto(batch={"values": values})

    @register(DATA_PARALLEL)
    def update_critic(self, data: DataProto) -> dict[str, float]:
        cfg = self.config
        return ppo_update(self.model, self.optimizer, data, self._value_loss, lr_scheduler=self.lr_scheduler,
                          mini_batch_size=cfg.ppo_mini_batch_size // self.world_size,
                          micro_batch_size=cfg.ppo_micro_batch_size_per_gpu, epochs=cfg.ppo_epochs,
                          grad_clip=cfg.grad_clip, mask_key="adv_mask", loss_agg_mode="token-mean",
                          device=self.device, prefix="critic")

    @register(ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """The value model as a Hugging Face folder and each rank's optimizer, LR-scheduler and RNG state."""
        weights = full_state_dict(self.model)  # a collective: every rank takes part, rank 0 writes
        if self.rank == 0:
            self.model.save_pretrained(path, state_dict=weights)
        save_train_state(path, self.rank, self.optimizer, self.lr_scheduler)

    @register(ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        load_full_state_dict(self.model, read_weights(self.model, path))
        load_train_state(path, self.rank, self.optimizer, self.lr_scheduler)

    def _value_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch["adv_mask"]
        values = self._forward(batch)
        losses, clipped = compute_value_loss(values=values, old_values=batch["values"], returns=batch["returns"],
                                             cliprange_value=self.config.cliprange_value)
        metrics = {"vf_loss": masked_mean(losses, mask).item(), "vf_clipfrac": masked_mean(clipped, mask).item(),
                   "vpred_mean": masked_mean(values, mask).item()}
        return (losses * mask).sum(), metrics

    def _forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        out = self.model(**forward_inputs(self.model, batch)).logits  # (B, T, 1)
        values = out[:, :-1, 0].float()  # position t - 1 holds V(tokens < t)
        return torch.nn.functional.pad(values, (1, 0))  # (B, T)
