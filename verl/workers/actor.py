"""ActorRolloutRefWorker: the policy being trained and the rollout engine that samples from it.

One instance per rank. The actor keeps fp32 master weights and runs its forward passes under bf16
autocast; the rollout engine keeps its own copy in the rollout dtype and is re-synced after every update.
A reference policy (for KL) belongs here too and arrives with the KL losses.

Batches are right-padded token sequences (B, T) with `loss_mask` on the generated tokens; per-token
tensors are aligned with `input_ids`, so `log_probs[:, t]` is log pi(token_t | tokens_<t) and column 0,
which no token predicts, is zero.
"""

from dataclasses import replace

import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller import DATA_PARALLEL, ONE_TO_ALL, Worker, register
from verl.trainer.config import ActorRolloutRefConfig
from verl.trainer.core_algos import compute_policy_loss, entropy_from_logits, masked_mean
from verl.utils.model import DTYPES, load_causal_lm, load_tokenizer
from verl.workers.rollout import ROLLOUT_ENGINES, SamplingParams


class ActorRolloutRefWorker(Worker):
    def __init__(self, config: ActorRolloutRefConfig, *, rank: int, world_size: int, init_method: str | None):
        super().__init__(rank, world_size, init_method)
        self.config = config

    @register(ONE_TO_ALL)
    def init_model(self) -> None:
        cfg = self.config
        self.tokenizer = load_tokenizer(cfg.model.path)
        self.model = load_causal_lm(cfg.model.path, "float32").to(self.device)
        self.model.config.use_cache = False  # training forwards never reuse a KV cache
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.actor.optim.lr,
                                           betas=tuple(cfg.actor.optim.betas),
                                           weight_decay=cfg.actor.optim.weight_decay)
        engine_cls = ROLLOUT_ENGINES[cfg.rollout.name]
        self.rollout = engine_cls(cfg.model.path, self.tokenizer, cfg.rollout.dtype, self.device)
        self.rollout.sync_weights(self.model.state_dict())

    @register(DATA_PARALLEL)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """prompt_ids (lists of ids) + meta_info['sampling'] -> response_ids (lists of ids)."""
        sampling: SamplingParams = prompts.meta_info["sampling"]
        if sampling.seed is not None:  # ranks must not draw the same samples for the same prompt
            sampling = replace(sampling, seed=sampling.seed + 7919 * self.rank)
        responses = self.rollout.generate(list(prompts.non_tensor_batch["prompt_ids"]), sampling)
        return DataProto(non_tensor_batch={"response_ids": responses})

    @register(DATA_PARALLEL)
    @torch.no_grad()
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """Log-probs of the sampled tokens under the current policy: the PPO ratio's denominator."""
        self.model.eval()
        micro_size = self.config.rollout.log_prob_micro_batch_size_per_gpu
        log_probs = [self._forward(micro.to(self.device).batch, with_entropy=False)[0]
                     for micro in data.split(micro_size)]
        return DataProto(batch={"old_log_probs": torch.cat(log_probs).cpu()})

    @register(DATA_PARALLEL)
    def update_actor(self, data: DataProto) -> dict[str, float]:
        """PPO epochs over mini-batches; each mini-batch is one optimizer step, accumulated over micro-batches."""
        cfg = self.config.actor
        self.model.train()
        mini_size = cfg.ppo_mini_batch_size // self.world_size
        history: dict[str, list[float]] = {}
        for _ in range(cfg.ppo_epochs):
            for mini in data.split(mini_size):
                self.optimizer.zero_grad()
                micros = mini.split(cfg.ppo_micro_batch_size_per_gpu)
                for micro in micros:
                    metrics = self._policy_loss_backward(micro, scale=1 / len(micros))
                    for k, v in metrics.items():
                        history.setdefault(k, []).append(v)
                history.setdefault("actor/grad_norm", []).append(self._optimizer_step())
        self.rollout.sync_weights(self.model.state_dict())
        history["actor/lr"] = [self.optimizer.param_groups[0]["lr"]]
        return {k: sum(v) / len(v) for k, v in history.items()}

    @register(ONE_TO_ALL)
    def save_model(self, path: str) -> None:
        """Write the policy as a Hugging Face folder (safetensors) that `from_pretrained` loads."""
        if self.rank == 0:
            self.model.save_pretrained(path)
            self.tokenizer.save_pretrained(path)

    def _policy_loss_backward(self, micro: DataProto, scale: float) -> dict[str, float]:
        batch = micro.to(self.device).batch
        log_probs, entropy = self._forward(batch, with_entropy=True)
        pg_loss, pg_metrics = compute_policy_loss(
            log_probs=log_probs, old_log_probs=batch["old_log_probs"], advantages=batch["advantages"],
            loss_mask=batch["loss_mask"], clip_ratio_low=self.config.actor.clip_ratio_low,
            clip_ratio_high=self.config.actor.clip_ratio_high)
        entropy_mean = masked_mean(entropy, batch["loss_mask"])
        loss = pg_loss - self.config.actor.entropy_coeff * entropy_mean
        (loss * scale).backward()
        return {"actor/pg_loss": pg_loss.item(), "actor/entropy": entropy_mean.item(),
                **{f"actor/{k}": v.item() for k, v in pg_metrics.items()}}

    def _optimizer_step(self) -> float:
        if self.world_size > 1:  # data parallel: every rank steps with the mean gradient
            for p in self.model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.actor.grad_clip)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        else:
            print(f"[rank {self.rank}] skipped an optimizer step: gradient norm is {grad_norm.item()}", flush=True)
        return grad_norm.item()

    def _forward(self, batch: dict[str, torch.Tensor], with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Token log-probs (B, T) aligned with input_ids, and the policy entropy (B, T) if asked."""
        input_ids = batch["input_ids"]  # (B, T)
        with torch.autocast(self.device.type, dtype=DTYPES[self.config.model.dtype]):
            logits = self.model(input_ids=input_ids, attention_mask=batch["attention_mask"],
                                position_ids=batch["position_ids"]).logits  # (B, T, V)
        logits = logits[:, :-1].float()  # (B, T-1, V): position t predicts token t+1
        log_probs = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
        log_probs = torch.nn.functional.pad(log_probs, (1, 0))  # (B, T): token 0 has no prediction
        entropy = torch.nn.functional.pad(entropy_from_logits(logits), (1, 0)) if with_entropy else None
        return log_probs, entropy
