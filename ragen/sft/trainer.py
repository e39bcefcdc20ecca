"""Fine-tuning on expert conversations: `bash sft/finetune_lora.sh sokoban 2 checkpoints/sft/sokoban`.

Launched with torchrun: every rank loads the model, wraps it in a PEFT LoRA adapter (or, with
`lora.rank=0`, trains every weight) and shards it with FSDP2 (verl/utils/fsdp.py), exactly like the RL
actor; each optimizer step takes `train_batch_size` conversations, split evenly over the ranks (data
parallel; gloo on CPU, NCCL on GPUs). The loss is the negative log-likelihood of the reply tokens only
(`loss_mask`, as in RL), averaged over all reply tokens of the step on all ranks together, so the update
does not depend on the number of ranks.

The run lasts `trainer.total_epochs` passes over the data, or `trainer.total_training_steps` steps when
that is set. After every epoch (or every `trainer.test_freq` steps) and at the end it evaluates on the test
split (loss, and format / action accuracy of greedy replies to the test prompts) and writes the model to
`trainer.default_local_dir`: the adapter in PEFT's format (`sft/utils/merge_lora.py` merges it into a full
model that `train.sh` takes as `model_path`), or with `lora.rank=0` the whole model as a safetensors folder
that `model_path=` takes as it is. Until the last step each save also keeps every rank's optimizer, LR-schedule
and random state, so a run killed or stopped between sittings continues where its last evaluation left it when
the same command runs again (`trainer.resume_mode=auto`), with the same sample order and schedule as an
unbroken run; the finished run drops that state (about twice the model's size for full fine-tuning).
"""

import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from ragen.config import AgentProxyConfig, ConfigError
from ragen.context_manager import ANSWER_CLOSE, parse_reply, reply_opening, reply_spans, reply_text
from ragen.envs.utils import from_png
from ragen.sft.data import tokenizer_fingerprint
from verl.protocol import DataProto
from verl.single_controller import Worker
from verl.trainer.config import ModelConfig, OptimConfig
from verl.utils.checkpoint import (config_changes, fixed_changes, listed_changes, load_train_state,
                                   save_train_state)
from verl.utils.fsdp import full_state_dict, load_full_state_dict, reshard
from verl.utils.lora import load_adapter_weights, merge_lora, save_adapter
from verl.utils.model import (load_processor, load_tokenizer, pack_shared_prefix, read_weights, resolve_dtype,
                              resolve_model_path, untied)
from verl.utils.run_folder import check_name, check_run_dir
from verl.utils.tracking import Tracking
from verl.utils.vlm import pixel_inputs
from verl.workers.actor import load_policy, token_log_probs
from verl.workers.ppo_update import make_optimizer, ppo_update
from verl.workers.rollout import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout


@dataclass
class SFTDataConfig:
    train_file: str = "data/sft/${env}/train.parquet"  # written by sft/generate_data.sh
    test_file: str = "data/sft/${env}/test.parquet"
    max_length: int = 4096  # longer conversations are an error, not silently cut


@dataclass
class SFTLoraConfig:
    rank: int = 64  # adapter rank; 0: full fine-tuning (every weight trained, the whole model saved)
    alpha: int = 32  # the adapter's output is scaled by alpha / rank
    target_modules: Any = "all-linear"  # "all-linear" or a list of module names, e.g. [q_proj, v_proj]
    dropout: float = 0.0


@dataclass
class SFTTrainerConfig:
    total_epochs: int = 1
    total_training_steps: int = -1  # optimizer steps in all (epochs follow from it); -1: total_epochs passes
    test_freq: int = -1  # evaluate and save every this many steps (and at the end); -1: after every epoch
    train_batch_size: int = 16  # conversations per optimizer step, over all ranks
    micro_batch_size_per_gpu: int = 2  # conversations per forward/backward (gradient accumulation)
    grad_clip: float = 1.0
    default_local_dir: str = "checkpoints/sft/${env}"  # the adapter, the config and the logs
    project_name: str = "ragen-sft"
    experiment_name: str = "${env}-lora"
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])  # console | jsonl | wandb | tensorboard
    seed: int = 0  # data order
    resume_mode: str = "auto"  # auto: continue the unfinished run saved in default_local_dir, if any | disable


@dataclass
class SFTEvalConfig:
    max_turns: int = 64  # test replies generated (greedily) for format/action accuracy; 0 skips generation
    max_new_tokens: int = 64  # per reply
    batch_size: int = 32  # prompts per generate call


@dataclass
class SFTConfig:
    env: str = "sokoban"  # names the data folder and the run
    model_path: str = "bundled:SmolLM2-135M-Instruct"  # must have the tokenizer the data was made with
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: SFTLoraConfig = field(default_factory=SFTLoraConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(
        lr=2e-4, lr_scheduler="cosine", lr_warmup_steps=5, total_training_steps=-1))  # length: set from the data
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)
    eval: SFTEvalConfig = field(default_factory=SFTEvalConfig)


ConfigStore.instance().store(name="sft_schema", node=SFTConfig)

# Settings a resumed run must share with the run it continues: the weights it started from, the adapter's shape,
# and what fixes the sample order. Others (the lr, the schedule's length, test_freq, the loggers) may change.
SFT_FIXED_ON_RESUME = ("model.path", "lora", "data.train_file", "trainer.seed", "trainer.train_batch_size")
STATE_FILE = "sft_state.json"


@dataclass
class Split:
    """Conversations of one parquet file: token ids and reply masks, plus what the evaluation needs."""

    input_ids: list[list[int]]
    loss_mask: list[list[int]]
    expert_replies: list[list[str]]  # per conversation, the oracle's reply of each turn
    reply_format: AgentProxyConfig  # the recipe's format settings, recorded by the data generator
    images: list[list[bytes]]  # per conversation, its pictures as PNG files, in the order of its image tokens

    def __len__(self) -> int:
        return len(self.input_ids)

    def fingerprint(self) -> str:
        """A hash of the conversations' tokens and masks: a resumed run must train on the same data."""
        digest = hashlib.sha256()
        for ids, mask in zip(self.input_ids, self.loss_mask, strict=True):
            digest.update(np.asarray(ids, dtype=np.int64).tobytes() + np.asarray(mask, dtype=np.int8).tobytes())
        return digest.hexdigest()[:16]


def load_split(path: str, tokenizer, max_length: int) -> Split:
    if not Path(path).is_file():
        raise ConfigError(f"no SFT data at {path}: generate it with `bash sft/generate_data.sh <env>` "
                          "(or point data.train_file / data.test_file at it)")
    table = pq.read_table(path)
    metadata = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    if metadata.get("ragen.tokenizer") != tokenizer_fingerprint(tokenizer):
        raise ConfigError(f"{path} was tokenized for model_path={metadata.get('ragen.model_path')!r}, whose tokenizer "
                          "differs from this model's: regenerate the data with the same model_path")
    input_ids, loss_mask = table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist()
    too_long = [i for i, ids in enumerate(input_ids) if len(ids) > max_length]
    if too_long:
        raise ConfigError(f"{len(too_long)} conversations of {path} exceed data.max_length={max_length} tokens "
                          f"(longest {max(len(input_ids[i]) for i in too_long)}): raise data.max_length")
    replies = [[turn["response"] for turn in json.loads(turns)] for turns in table.column("turns").to_pylist()]
    reply_format = AgentProxyConfig(**{k: v for k, v in json.loads(metadata["ragen.agent_proxy"]).items()
                                       if k != "reward_normalization"})
    images = table.column("images").to_pylist() if "images" in table.column_names else [[] for _ in input_ids]
    return Split(input_ids, loss_mask, replies, reply_format, images)


def collate(split: Split, indices, pad_id: int, processor=None) -> DataProto:
    """Right-padded (B, T) tensors in the layout the actor's forward takes; with pictures (a vision-language
    model's `processor`), their pixel inputs too (verl.utils.vlm.pixel_inputs)."""
    width = max(len(split.input_ids[i]) for i in indices)
    batch = {"input_ids": torch.full((len(indices), width), pad_id, dtype=torch.long),
             "attention_mask": torch.zeros((len(indices), width), dtype=torch.long),
             "position_ids": torch.zeros((len(indices), width), dtype=torch.long),
             "loss_mask": torch.zeros((len(indices), width), dtype=torch.float32)}
    for row, i in enumerate(indices):
        n = len(split.input_ids[i])
        batch["input_ids"][row, :n] = torch.tensor(split.input_ids[i])
        batch["attention_mask"][row, :n] = 1
        batch["position_ids"][row, :n] = torch.arange(n)
        batch["loss_mask"][row, :n] = torch.tensor(split.loss_mask[i], dtype=torch.float32)
    if any(split.images[i] for i in indices):
        batch |= pixel_inputs(processor, [[from_png(data) for data in split.images[i]] for i in indices])
    return DataProto(batch=batch)


class SFTTrainer(Worker):
    """One torchrun rank: its device and process group come from `Worker`, like the RL workers' (the env://
    rendezvous that torchrun sets up; a lone rank joins a one-rank group)."""

    def __init__(self, cfg: SFTConfig, rank: int, world_size: int):
        super().__init__(rank, world_size, init_method="env://")
        self.cfg = cfg
        _check_config(cfg, world_size)
        if rank == 0:  # the bundled model is converted once, by one rank
            resolve_model_path(cfg.model.path)
            if (staging := Path(cfg.trainer.default_local_dir) / ".staging" / STATE_FILE).is_file():
                publish(staging.parent, staging.parent.parent)  # a save killed while it moved its files
        dist.barrier()
        cfg.model.path = resolve_model_path(cfg.model.path)
        cfg.model.dtype = resolve_dtype(cfg.model.dtype)  # `auto` made concrete here (and saved so)
        self.tokenizer = load_tokenizer(cfg.model.path)
        self.train = load_split(cfg.data.train_file, self.tokenizer, cfg.data.max_length)
        self.test = load_split(cfg.data.test_file, self.tokenizer, cfg.data.max_length)
        self.processor = load_processor(cfg.model.path)  # a vision-language model's, for data with pictures
        if self.processor is None and any(self.train.images + self.test.images):
            raise ConfigError(f"{cfg.data.train_file} holds pictures, which model.path={cfg.model.path!r} cannot read: "
                              "train a vision-language model on it (the one the data was generated with)")
        self.steps_per_epoch = len(self.train) // cfg.trainer.train_batch_size
        if self.steps_per_epoch == 0:
            raise ConfigError(f"{len(self.train)} training conversations do not fill one batch of "
                              f"trainer.train_batch_size={cfg.trainer.train_batch_size}")
        cfg.optim.total_training_steps = cfg.trainer.total_training_steps if cfg.trainer.total_training_steps > 0 \
            else cfg.trainer.total_epochs * self.steps_per_epoch
        self.train_data = self.train.fingerprint()
        self.resume_step = resumable_step(cfg, world_size, self.train_data) if cfg.trainer.resume_mode == "auto" else 0

        self.model = load_policy(cfg.model, self.device, lora_rank=cfg.lora.rank, lora_alpha=cfg.lora.alpha,
                                 target_modules=cfg.lora.target_modules, lora_dropout=cfg.lora.dropout)
        self.optimizer, self.lr_scheduler = make_optimizer(self.model, cfg.optim)
        if 0 < self.resume_step < cfg.optim.total_training_steps:
            self._load(cfg.trainer.default_local_dir)
        self.generator = HFRollout(cfg.model.path, self.tokenizer, cfg.model.dtype, self.device, prefix_cache=False) \
            if cfg.eval.max_turns > 0 else None
        self.tracker = Tracking(cfg.trainer.logger, cfg.trainer.default_local_dir, cfg.trainer.project_name,
                                cfg.trainer.experiment_name, config=asdict(cfg)) if rank == 0 else None
        if self.tracker is not None and self.resume_step > 0:
            self.tracker.truncate(self.resume_step)  # the log goes on from the saved step

    def _load(self, folder: str) -> None:
        """The weights and every rank's optimizer, schedule and random state of the unfinished run in `folder`."""
        if self.cfg.lora.rank > 0:
            load_adapter_weights(self.model, folder)
        else:
            load_full_state_dict(self.model, read_weights(self.model, folder))
        load_train_state(folder, self.rank, self.optimizer, self.lr_scheduler)
        if self.rank == 0:
            print(f"[sft] resuming {folder} after step {self.resume_step} of {self.cfg.optim.total_training_steps}",
                  flush=True)

    def fit(self) -> dict[str, float]:
        try:
            return self._fit()
        finally:
            if self.tracker is not None:
                self.tracker.finish()  # wandb uploads, tensorboard flushes, also on Ctrl-C

    def _fit(self) -> dict[str, float]:
        cfg = self.cfg.trainer
        per_rank = cfg.train_batch_size // self.world_size
        if self.resume_step == 0:
            metrics = self.evaluate()
            self._log(metrics, 0)
        total, metrics = self.cfg.optim.total_training_steps, {}
        for step in range(self.resume_step + 1, total + 1):
            epoch, s = divmod(step - 1, self.steps_per_epoch)
            # each pass over the data in an order that is the same on every rank and in a resumed run
            order = np.random.default_rng([cfg.seed, epoch]).permutation(len(self.train))
            start = time.perf_counter()
            batch_rows = order[s * cfg.train_batch_size:(s + 1) * cfg.train_batch_size]
            batch = collate(self.train, batch_rows[self.rank * per_rank:(self.rank + 1) * per_rank],
                            self.tokenizer.pad_token_id, self.processor)
            metrics = ppo_update(self.model, self.optimizer, batch, self._nll, lr_scheduler=self.lr_scheduler,
                                 mini_batch_size=per_rank, micro_batch_size=cfg.micro_batch_size_per_gpu,
                                 epochs=1, grad_clip=cfg.grad_clip, mask_key="loss_mask",
                                 loss_agg_mode="token-mean", device=self.device, prefix="sft")
            seconds = time.perf_counter() - start
            metrics |= {"perf/tokens_per_s": batch.batch["attention_mask"].sum().item() / seconds}
            metrics = _mean_over_ranks(metrics, self.device)
            metrics["perf/tokens_per_s"] *= self.world_size  # all ranks together
            metrics |= {"sft/epoch": step / self.steps_per_epoch, "timing_s/step": seconds}
            due = step % cfg.test_freq == 0 if cfg.test_freq > 0 else s == self.steps_per_epoch - 1
            if due or step == total:
                metrics |= self.evaluate()
                self.save(step)
            self._log(metrics, step)
        return metrics

    def _nll(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """The summed negative log-likelihood of the reply tokens of a micro-batch (ppo_update averages it). Rows
        that begin alike (the system prompt of per-move rows) are packed into one, their shared prefix computed once."""
        batch = pack_shared_prefix(batch)
        log_probs, _ = token_log_probs(self.model, batch, with_entropy=False, temperature=1.0)
        mask = batch["loss_mask"]
        nll = -(log_probs * mask).sum()
        return nll, {}  # ppo_update logs the mini-batch's mean as sft/loss

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Test-split loss (teacher-forced) and, for up to `eval.max_turns` test turns, whether the greedy reply
        is well-formed (`val/format_accuracy`) and names the expert's actions (`val/action_accuracy`)."""
        self.model.eval()
        # nll, reply tokens, turns scored, well-formed, expert actions; on the rank's device (NCCL reduces CUDA tensors)
        totals = torch.zeros(5, dtype=torch.float64, device=self.device)
        rows = list(range(self.rank, len(self.test), self.world_size))
        per_rank = -(-len(self.test) // self.world_size)  # every rank runs as many forwards (FSDP all-gathers)
        micro = self.cfg.trainer.micro_batch_size_per_gpu
        for start in range(0, per_rank, micro):
            chunk = rows[start:start + micro] or [0]  # a rank out of rows runs a dummy forward and counts nothing
            batch = collate(self.test, chunk, self.tokenizer.pad_token_id, self.processor).to(self.device).batch
            batch = pack_shared_prefix(batch)
            log_probs, _ = token_log_probs(self.model, batch, with_entropy=False, temperature=1.0)
            if rows[start:start + micro]:
                totals[0] -= (log_probs * batch["loss_mask"]).sum().item()
                totals[1] += batch["loss_mask"].sum().item()
        reshard(self.model)
        if self.generator is not None:
            self.generator.sync_weights(self._weights())
            totals[2:] += self._score_replies().to(self.device)
        dist.all_reduce(totals)
        metrics = {"val/loss": float(totals[0] / max(totals[1], 1))}
        if self.generator is not None:
            metrics |= {"val/format_accuracy": float(totals[3] / max(totals[2], 1)),
                        "val/action_accuracy": float(totals[4] / max(totals[2], 1))}
        return metrics

    def _score_replies(self) -> torch.Tensor:
        """(turns, well-formed, expert actions) over this rank's share of the first `max_turns` test turns."""
        fmt, cfg = self.test.reply_format, self.cfg.eval
        turns = [(i, start, k) for i in range(len(self.test))
                 for k, (start, _) in enumerate(reply_spans(self.test.loss_mask[i]))][:cfg.max_turns]
        mine = turns[self.rank::self.world_size]
        sampling = SamplingParams(temperature=0.0, max_new_tokens=cfg.max_new_tokens, stop=[ANSWER_CLOSE])
        reply_open = reply_opening(fmt.enable_think)

        def parse(text: str):
            return parse_reply(text, fmt.enable_think, fmt.action_sep, fmt.max_actions_per_turn)

        counts = torch.zeros(3, dtype=torch.float64)
        for start in range(0, len(mine), cfg.batch_size):
            chunk = mine[start:start + cfg.batch_size]
            prompts = [self.test.input_ids[i][:s] for i, s, _ in chunk]
            pictures = [[from_png(data) for data in self.test.images[i]] for i, _, _ in chunk]  # empty for text
            responses = self.generator.generate(prompts, sampling, images=pictures).token_ids
            for (i, _, k), response in zip(chunk, responses):
                parsed = parse(reply_text(self.tokenizer, response, reply_open))
                expert = parse(self.test.expert_replies[i][k])
                counts += torch.tensor([1.0, parsed.format_ok, parsed.format_ok and parsed.actions == expert.actions])
        return counts

    def _weights(self) -> dict[str, torch.Tensor]:
        """The weights the model computes with, under the base model's keys (a collective: every rank calls it)."""
        weights, lora = full_state_dict(self.model), self.cfg.lora
        return merge_lora(weights, lora.alpha / lora.rank) if lora.rank > 0 else weights

    def save(self, step: int) -> None:
        """The adapter (PEFT format) or, in full fine-tuning, the whole model (safetensors), with the tokenizer
        and the config, in `default_local_dir`, and before the last step each rank's training state (for a
        resume): written aside, then moved in (`publish`)."""
        target = Path(self.cfg.trainer.default_local_dir)
        staging = target / ".staging"
        if self.rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
        weights = full_state_dict(self.model)  # a collective: every rank takes part (after the rmtree), rank 0 writes
        total = self.cfg.optim.total_training_steps
        if step < total:
            save_train_state(staging, self.rank, self.optimizer, self.lr_scheduler)
        dist.barrier()
        if self.rank == 0:
            if self.cfg.lora.rank > 0:
                save_adapter(self.model, weights, staging)
            else:
                self.model.save_pretrained(staging, state_dict=untied(weights, self.model.config))
            self.tokenizer.save_pretrained(staging)
            if self.processor is not None:  # a vision-language model's image processor (and processor) with it
                self.processor.save_pretrained(staging)
            OmegaConf.save(OmegaConf.structured(self.cfg), staging / "sft_config.yaml")
            state = {"step": step, "total_steps": total, "world_size": self.world_size,
                     "epoch": step / self.steps_per_epoch, "base_model": self.cfg.model.path,
                     "train_data": self.train_data}
            (staging / STATE_FILE).write_text(json.dumps(state), encoding="utf-8")  # the last file: staging is whole
            publish(staging, target)
            what = "adapter" if self.cfg.lora.rank > 0 else "model (full fine-tuning)"
            print(f"[sft] step {step}: {what} saved to {target}", flush=True)
        dist.barrier()

    def _log(self, metrics: dict[str, float], step: int) -> None:
        if self.tracker is not None:
            self.tracker.log(metrics, step)


def _mean_over_ranks(metrics: dict[str, float], device: torch.device) -> dict[str, float]:
    keys = sorted(metrics)
    values = torch.tensor([metrics[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(values)
    return {k: float(v) / dist.get_world_size() for k, v in zip(keys, values)}


def publish(staging: Path, target: Path) -> None:
    """Move a save's files from `staging` (whole: `sft_state.json` is written there last) into `target`: the old
    `sft_state.json` goes first and the new one comes last, so a folder with that file never mixes two saves,
    and a move cut short is finished by running this again."""
    (target / STATE_FILE).unlink(missing_ok=True)
    for old in target.glob("train_state_rank*.pt"):  # a finished run keeps none
        if not (staging / old.name).is_file():
            old.unlink()
    for file in sorted(staging.iterdir(), key=lambda f: f.name == STATE_FILE):
        os.replace(file, target / file.name)
    staging.rmdir()


def resumable_step(cfg: SFTConfig, world_size: int, train_data: str) -> int:
    """The step after which the unfinished run saved in `default_local_dir` stopped (0: none there, start
    afresh); a ConfigError where that run cannot go on as this one. `train_data`: `Split.fingerprint` of the
    training data, which must be the saved run's (a save made before fingerprints were kept is not checked)."""
    folder = Path(cfg.trainer.default_local_dir)
    if not (folder / STATE_FILE).is_file():
        return 0
    state = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
    start_over = ("start over with trainer.resume_mode=disable (which replaces that model), or save to another "
                  "trainer.default_local_dir")
    if "total_steps" not in state:  # written before runs could resume: nothing to continue
        return 0
    step, total = state["step"], cfg.optim.total_training_steps
    changes = config_changes(OmegaConf.to_container(OmegaConf.load(folder / "sft_config.yaml")),
                             asdict(cfg))
    fixed = fixed_changes(changes, SFT_FIXED_ON_RESUME)
    if fixed:
        raise ConfigError(f"{folder} holds a run (step {step} of {state['total_steps']}) with other values of "
                          f"settings a resume cannot change:\n{listed_changes(fixed)}\n{start_over}")
    if "train_data" in state and state["train_data"] != train_data:  # older saves kept no fingerprint
        raise ConfigError(f"{folder} holds a run (step {step} of {state['total_steps']}) trained on other data than "
                          f"{cfg.data.train_file} now holds (made anew since?): {start_over}")
    if step >= state["total_steps"]:
        if step == total:
            print(f"[sft] {folder} holds this run, finished at step {step}: nothing to do", flush=True)
            return step
        raise ConfigError(f"{folder} holds a finished run of {step} steps, and a finished run keeps no optimizer "
                          f"state to go on to {total}: {start_over}; or train further from its weights with "
                          f"model.path={folder} into another folder")
    if state["world_size"] != world_size:
        raise ConfigError(f"{folder} holds an unfinished run of {state['world_size']} rank(s) and this one has "
                          f"{world_size}: each rank resumes its own optimizer shard; run as many, or {start_over}")
    if changes:
        print(f"[sft] resuming {folder} with settings changed since it was saved:\n{listed_changes(changes)}",
              flush=True)
    return step


def _check_config(cfg: SFTConfig, world_size: int) -> None:
    t = cfg.trainer
    checks = [
        (t.resume_mode in ("auto", "disable"), f"trainer.resume_mode must be auto or disable, not {t.resume_mode!r}"),
        (cfg.lora.rank >= 0, "lora.rank must be >= 1 (a LoRA adapter) or 0 (full fine-tuning)"),
        (t.total_epochs >= 1, "trainer.total_epochs must be >= 1"),
        (t.total_training_steps == -1 or t.total_training_steps >= 1,
         "trainer.total_training_steps must be >= 1, or -1 (total_epochs passes over the data)"),
        (t.test_freq == -1 or t.test_freq >= 1, "trainer.test_freq must be >= 1, or -1 (after every epoch)"),
        (t.micro_batch_size_per_gpu >= 1, "trainer.micro_batch_size_per_gpu must be >= 1"),
        (t.train_batch_size % (world_size * t.micro_batch_size_per_gpu) == 0,
         f"trainer.train_batch_size={t.train_batch_size} must be a multiple of the ranks ({world_size}) x "
         f"trainer.micro_batch_size_per_gpu ({t.micro_batch_size_per_gpu})"),
        (cfg.optim.lr > 0, "optim.lr must be > 0"),
        (cfg.eval.max_turns >= 0 and cfg.eval.max_new_tokens >= 1 and cfg.eval.batch_size >= 1,
         "eval.max_turns must be >= 0, eval.max_new_tokens and eval.batch_size >= 1"),
    ]
    # its names and folder, like an RL run's (verl/utils/run_folder.py): the model is saved there
    checks += [(problem is None, problem) for problem in (
        check_name("trainer.project_name", t.project_name), check_name("trainer.experiment_name", t.experiment_name),
        check_run_dir(t.default_local_dir))]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


@hydra.main(config_path="../../config", config_name="sft", version_base="1.3")
def main(cfg) -> None:
    if torch.cuda.is_available():  # torchrun starts one process per GPU of the node: this one's is LOCAL_RANK
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))  # set by torchrun
    try:
        SFTTrainer(OmegaConf.to_object(cfg), rank, world_size).fit()
    except ConfigError as e:
        sys.exit(f"config error: {e}")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
