"""ActorRolloutRefWorker: the policy being trained, the rollout engine that samples from it, and the
frozen reference policy (loaded only when KL is on; with LoRA it is the same model with the adapter off).

One instance per rank. The actor is sharded over the ranks with FSDP2 (verl/utils/fsdp.py): fp32 master
weights, forward passes in `model.dtype` (`auto`: bf16 on a GPU or a CPU with AMX or AMD's
avx512_bf16, else fp32, resolved here);
the rollout engine keeps its own whole copy in the rollout dtype and is re-synced after every update.

Batches are right-padded token sequences (B, T) with `loss_mask` on the generated tokens; per-token
tensors are aligned with `input_ids`, so `log_probs[:, t]` is log pi(token_t | tokens_<t) where
`loss_mask[:, t]` is set, and zero elsewhere: the actor computes logits only where a generated token is
scored (token_log_probs).

The policy is the distribution the rollout samples from: softmax(logits / rollout.temperature). Every
log-prob of a sampled token (old, new, reference) and the entropy are computed at that temperature, as
veRL does; at T = 1 the ratio and the clip would refer to a policy that never produced the samples.
"""

from dataclasses import replace

import torch

from verl.protocol import DataProto
from verl.single_controller import DATA_PARALLEL, ONE_TO_ALL, Worker, register
from verl.trainer.config import ActorRolloutRefConfig, LoraConfig, ModelConfig
from verl.trainer.core_algos import (KL_PENALTIES, LOSS_AGG_MODES, compute_policy_loss, entropy_from_log_probs,
                                     masked_mean, rollout_mismatch, truncated_is_weights)
from verl.utils import memory
from verl.utils.checkpoint import load_train_state, save_train_state
from verl.utils.fingerprint import check_weight_sync, weight_fingerprints
from verl.utils.fsdp import full_state_dict, load_full_state_dict, reshard, shard_model
from verl.utils.lora import adapter_disabled, apply_lora, load_adapter_weights, merge_lora, save_adapter
from verl.utils.model import (DTYPES, attention_implementation, enable_activation_checkpointing, forward_inputs,
                              last_hidden_states, load_causal_lm, load_processor, load_tokenizer, read_weights,
                              resolve_dtype, untied)
from verl.workers.ppo_update import make_optimizer, ppo_update, score_micro_batches
from verl.workers.rollout import ROLLOUT_ENGINES, SamplingParams


class ActorRolloutRefWorker(Worker):
    def __init__(self, config: ActorRolloutRefConfig, lora: LoraConfig | None = None, *, rank: int, world_size: int,
                 init_method: str | None, verbose: bool = True):
        super().__init__(rank, world_size, init_method, verbose)
        # `auto` dtypes made concrete on the machine the worker runs on
        self.config = replace(config, model=replace(config.model, dtype=resolve_dtype(config.model.dtype)),
                              rollout=replace(config.rollout, dtype=resolve_dtype(config.rollout.dtype)))
        self.lora = lora or LoraConfig()

    @register(ONE_TO_ALL)
    def init_model(self, use_reference: bool = False) -> None:
        cfg = self.config
        self.tokenizer = load_tokenizer(cfg.model.path)
        self.processor = load_processor(cfg.model.path)  # a vision-language model's: each checkpoint keeps it
        self.model = load_policy(cfg.model, self.device, lora_rank=self.lora.rank, lora_alpha=self.lora.alpha,
                                 target_modules=self.lora.target_modules)
        self.optimizer, self.lr_scheduler = make_optimizer(self.model, cfg.actor.optim)
        self.ref_model = None
        if use_reference and self.lora.rank == 0:  # the initial policy, frozen (with LoRA: adapter off)
            frozen = replace(cfg.model, enable_gradient_checkpointing=False)  # no backward ever runs through it
            self.ref_model = load_policy(frozen, self.device).eval().requires_grad_(False)
        self.use_reference = use_reference
        engine_cls = ROLLOUT_ENGINES[cfg.rollout.name]
        self.rollout = engine_cls(cfg.model.path, self.tokenizer, cfg.rollout.dtype, self.device)
        self._sync_rollout()

    @register(DATA_PARALLEL)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """prompt_ids (lists of ids) + meta_info['sampling'] -> response_ids (lists of ids) and
        response_log_probs (lists of floats, the engine's log-prob of each response id: `Generation`)."""
        sampling: SamplingParams = prompts.meta_info["sampling"]
        if sampling.seed is not None:  # ranks must not draw the same samples for the same prompt
            sampling = replace(sampling, seed=sampling.seed + 7919 * self.rank)
        prompt_ids = list(prompts.non_tensor_batch["prompt_ids"])
        if "prompt_images" in prompts.non_tensor_batch:  # each prompt's pictures (image envs; every engine takes them)
            images = list(prompts.non_tensor_batch["prompt_images"])
            generation = self.rollout.generate(prompt_ids, sampling, images=images)
        else:
            generation = self.rollout.generate(prompt_ids, sampling)
        return DataProto(non_tensor_batch={"response_ids": generation.token_ids,
                                           "response_log_probs": generation.log_probs})

    @register(DATA_PARALLEL)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """Log-probs of the sampled tokens under the current policy: the PPO ratio's denominator."""
        return DataProto(batch={"old_log_probs": self._score(self.model, data)})

    @register(DATA_PARALLEL)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """Log-probs of the sampled tokens under the reference policy, for the KL loss or KL penalty."""
        assert self.use_reference, "init_model(use_reference=True) sets up the reference policy"
        if self.lora.rank > 0:
            with adapter_disabled(self.model) as reference:
                return DataProto(batch={"ref_log_probs": self._score(reference, data)})
        return DataProto(batch={"ref_log_probs": self._score(self.ref_model, data)})

    @register(DATA_PARALLEL)
    def update_actor(self, data: DataProto) -> dict[str, float]:
        """PPO epochs over mini-batches; each mini-batch is one optimizer step, accumulated over micro-batches."""
        cfg = self.config.actor
        self.rollout.clear_cache()  # the last turn's K/V (~1 GB on the CPU recipes): stale after the update
        metrics = ppo_update(self.model, self.optimizer, data, self._policy_loss, lr_scheduler=self.lr_scheduler,
                             mini_batch_size=cfg.ppo_mini_batch_size // self.world_size,
                             micro_batch_size=cfg.ppo_micro_batch_size_per_gpu, epochs=cfg.ppo_epochs,
                             grad_clip=cfg.grad_clip, mask_key="loss_mask", loss_agg_mode=cfg.loss_agg_mode,
                             device=self.device, prefix="actor")
        self._sync_rollout()
        metrics["perf/peak_memory_gib"] = memory.peak_memory_gib(self.device)  # rollout's and update's
        return metrics

    @register(ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """The policy as a Hugging Face folder (safetensors; `from_pretrained` loads it) and each rank's
        optimizer, LR-scheduler and RNG state, for an exact resume."""
        weights = full_state_dict(self.model)  # a collective: every rank takes part, rank 0 writes
        if self.rank == 0:
            if self.lora.rank > 0:
                save_adapter(self.model, weights, path)
                if self.lora.save_merged:
                    base = self.model.get_base_model()
                    merged = merge_lora(weights, self.lora.alpha / self.lora.rank)
                    base.save_pretrained(f"{path}_merged", state_dict=untied(merged, base.config))
                    self._save_preprocessing(f"{path}_merged")
            else:
                self.model.save_pretrained(path, state_dict=untied(weights, self.model.config))
            self._save_preprocessing(path)
        save_train_state(path, self.rank, self.optimizer, self.lr_scheduler)

    def _save_preprocessing(self, path: str) -> None:
        """The tokenizer, and a vision-language model's processor: a checkpoint is a model_path that evaluation and
        a later run load whole."""
        self.tokenizer.save_pretrained(path)
        if self.processor is not None:
            self.processor.save_pretrained(path)

    @register(ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        if self.lora.rank > 0:
            load_adapter_weights(self.model, path)
        else:
            load_full_state_dict(self.model, read_weights(self.model, path))
        load_train_state(path, self.rank, self.optimizer, self.lr_scheduler)
        self._sync_rollout()

    def rollout_weights(self) -> dict[str, torch.Tensor]:
        """What the rollout engine samples with: the policy's whole weights, LoRA adapters merged in."""
        weights = full_state_dict(self.model)
        return merge_lora(weights, self.lora.alpha / self.lora.rank) if self.lora.rank > 0 else weights

    def _sync_rollout(self) -> None:
        """Load the policy into the rollout engine, then check that the engine's live model holds it: a sync
        that silently missed a tensor would sample from another policy (verl/utils/fingerprint.py)."""
        weights = self.rollout_weights()
        self.rollout.sync_weights(weights)
        if self.config.rollout.check_weight_sync:
            expected = weight_fingerprints(weights, DTYPES[self.config.rollout.dtype])
            check_weight_sync(expected, self.rollout.weight_fingerprint(), engine=self.config.rollout.name)

    def _policy_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """Summed (not yet averaged) PPO loss of a micro-batch: policy gradient - entropy bonus + KL loss.
        Logs how far the old log-probs are from the rollout engine's (`rollout_mismatch`), and with
        `tis_imp_ratio_cap` weights each token's policy-gradient loss by its truncated importance ratio."""
        cfg, mask = self.config.actor, batch["loss_mask"]
        aggregate = LOSS_AGG_MODES[cfg.loss_agg_mode]
        log_probs, entropy = token_log_probs(self.model, batch, with_entropy=True,
                                             temperature=self.config.rollout.temperature)
        # without old log-probs the batch is on-policy (the trainer's on_policy_batch): ratio 1, gradient of log p
        old_log_probs = batch["old_log_probs"] if "old_log_probs" in batch else log_probs.detach()
        pg_losses, pg_metrics = compute_policy_loss(
            log_probs=log_probs, old_log_probs=old_log_probs, advantages=batch["advantages"],
            loss_mask=mask, clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
            clip_ratio_c=cfg.clip_ratio_c)
        pg_metrics |= rollout_mismatch(old_log_probs=old_log_probs, rollout_log_probs=batch["rollout_log_probs"],
                                       loss_mask=mask)
        if cfg.tis_imp_ratio_cap is not None:  # the engine drew the tokens: reweight them to the trainer's policy
            weights = truncated_is_weights(old_log_probs=old_log_probs, rollout_log_probs=batch["rollout_log_probs"],
                                           cap=cfg.tis_imp_ratio_cap)
            pg_losses = pg_losses * weights
            pg_metrics["tis_weight_mean"] = masked_mean(weights, mask)
        (pg_loss, units), (entropy_sum, _) = aggregate(pg_losses, mask), aggregate(entropy, mask)
        loss = pg_loss - cfg.entropy_coeff * entropy_sum
        metrics = {"pg_loss": (pg_loss / units).item(), "entropy": masked_mean(entropy, mask).item(),
                   **{k: v.item() for k, v in pg_metrics.items()}}
        if "ref_log_probs" in batch:  # the reference exists only when KL is on; its distance is always logged
            kl = KL_PENALTIES[cfg.kl_loss_type](log_probs, batch["ref_log_probs"])
            metrics["kl_loss"] = masked_mean(kl, mask).item()
            if cfg.use_kl_loss:
                loss = loss + cfg.kl_loss_coef * aggregate(kl, mask)[0]
        return loss, metrics

    @torch.no_grad()
    def _score(self, model: torch.nn.Module, data: DataProto) -> torch.Tensor:
        model.eval()
        temperature = self.config.rollout.temperature
        log_probs = score_micro_batches(
            data, self.config.rollout.log_prob_micro_batch_size_per_gpu, self.device,
            lambda micro: token_log_probs(model, micro, with_entropy=False, temperature=temperature)[0])
        reshard(model)  # no backward follows: free the gathered weights
        return log_probs


def load_policy(model_config: ModelConfig, device: torch.device, *, lora_rank: int = 0, lora_alpha: int = 16,
                target_modules: str | list[str] = "all-linear", lora_dropout: float = 0.0) -> torch.nn.Module:
    """The causal LM as the trainers hold it: fp32 master weights on `device`, no KV cache, gradient
    checkpointing if asked, a LoRA adapter when `lora_rank` > 0, sharded with FSDP2. The RL actor, its frozen
    reference and the SFT trainer load it here; build the optimizer from it afterwards."""
    attention = attention_implementation(model_config.dtype)
    model = load_causal_lm(model_config.path, "float32", attention).to(device)
    model.config.use_cache = False  # training forwards never reuse a KV cache
    if model_config.enable_gradient_checkpointing:
        enable_activation_checkpointing(model)
    if lora_rank > 0:
        model = apply_lora(model, rank=lora_rank, alpha=lora_alpha, target_modules=target_modules,
                           dropout=lora_dropout)
    shard_model(model, param_dtype=model_config.dtype, cpu_offload=model_config.cpu_offload)
    return model


def token_log_probs(model: torch.nn.Module, batch: dict[str, torch.Tensor], *, with_entropy: bool,
                    temperature: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (B, T) of the tokens marked in `loss_mask`, aligned with input_ids, and the policy entropy
    (B, T) at them if asked, under softmax(logits / temperature): column t is about token t given the
    tokens before it. Every other column (prompts, padding, column 0, which nothing predicts) is 0.

    Logits are computed only at the positions that predict a marked token: in a multi-turn batch most
    tokens are prompts and observations, and the full-vocabulary logits cost more than the model's blocks.
    With a context window (`hidden_from` in the batch) each token is scored in the context its turn's prompt
    held (`forward_inputs`). Used by the PPO update and the scoring passes (at the rollout temperature) and
    the SFT loss (ragen/sft/trainer.py, at 1)."""
    input_ids = batch["input_ids"]  # (B, T); FSDP computes in model.dtype over fp32 master weights
    hidden = last_hidden_states(model, **forward_inputs(model, batch))  # (B, T, H)
    predicting = batch["loss_mask"][:, 1:].bool()  # (B, T-1): position t predicts token t+1
    scored = torch.nn.functional.pad(predicting, (1, 0))  # (B, T): token 0 has no prediction
    logits = model.get_output_embeddings()(hidden[:, :-1][predicting]).float()  # (N, V)
    if temperature != 1.0:  # x / 1.0 is x: skipping it saves two passes over the (N, V) logits
        logits = logits / temperature
    log_p = torch.log_softmax(logits, dim=-1)  # once, for the tokens' log-probs and the entropy
    log_probs = log_p.gather(-1, input_ids[scored][:, None]).squeeze(-1)  # (N,)
    zeros = torch.zeros(input_ids.shape, dtype=logits.dtype, device=logits.device)
    entropy = zeros.masked_scatter(scored, entropy_from_log_probs(log_p)) if with_entropy else None
    return zeros.masked_scatter(scored, log_probs), entropy
