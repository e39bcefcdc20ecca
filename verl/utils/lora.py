"""LoRA for RL with PEFT: one model is both the policy being trained and the frozen reference.

- `apply_lora` wraps a Hugging Face causal LM so that only the low-rank adapters train; the base weights
  stay frozen in the same module.
- The reference policy is that same model with the adapter switched off (`adapter_disabled`), which is
  exactly the initial policy, since a fresh adapter's B is zero. No second copy of the weights is loaded.
- The rollout engine knows nothing of adapters: `merge_lora` gives it W + (alpha / rank) * B @ A under
  the base model's own key names, computed next to the live weights, which stay unmerged.
- A checkpoint holds the adapter only (`save_adapter`, `load_adapter_weights` for resume); the merged
  weights saved with the base model's `save_pretrained` make a folder `from_pretrained` loads.
All of them work on whole state dicts, so the model may be sharded with FSDP (verl/utils/fsdp.py).
"""

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

ADAPTER = "default"  # PEFT's name for the single adapter we train
PREFIX = "base_model.model."  # where a PEFT model keeps the wrapped model
INIT_SEED = 0  # every rank (and every run) draws the same lora_A


def apply_lora(model: torch.nn.Module, *, rank: int, alpha: int, target_modules: str | list[str],
               dropout: float = 0.0):
    """Wrap `model` in a PEFT causal-LM model with a fresh LoRA adapter; only lora_A/lora_B train.

    `target_modules` is a list of module-name suffixes (["q_proj", "v_proj"]) or "all-linear" (every
    linear layer except the output head). lora_A is drawn from a fixed seed without touching the caller's
    random stream; lora_B is zero, so the wrapped model computes exactly what `model` did.
    """
    from peft import LoraConfig, TaskType, get_peft_model

    config = LoraConfig(task_type=TaskType.CAUSAL_LM, r=rank, lora_alpha=alpha, target_modules=target_modules,
                        lora_dropout=dropout)
    tied = _tied_parameters(model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(INIT_SEED)
        peft_model = get_peft_model(model, config)
    for name, module in _lora_layers(peft_model):
        if id(module.get_base_layer().weight) in tied:
            # the merged weight would have to differ from the tied twin that shares its storage
            raise ValueError(f"lora.target_modules adapts {name}, whose weight is tied to another layer "
                             "(tie_word_embeddings); leave the embeddings and lm_head out of lora.target_modules")
    return peft_model


@torch.no_grad()
def merge_lora(weights: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """The weights the adapted model computes with, W + scale * B @ A (scale = alpha / rank), under the
    base model's own keys, from the PEFT model's whole state dict (`verl.utils.fsdp.full_state_dict`).

    The keys are exactly those of the unwrapped model's `state_dict()` (no `base_model.model.` prefix, no
    `.base_layer`, no lora_ tensors), so a rollout engine or a plain `AutoModelForCausalLM` loads them.
    New tensors: the live weights stay unmerged (merging in place and unmerging is not exact).
    """
    merged = {}
    for key, tensor in weights.items():
        if ".lora_" in key:
            continue
        name = key.removeprefix(PREFIX)
        if ".base_layer." in key:
            layer = key[:key.index(".base_layer.")]
            if key.endswith(".weight"):
                lora_a = weights[f"{layer}.lora_A.{ADAPTER}.weight"]  # (rank, in)
                lora_b = weights[f"{layer}.lora_B.{ADAPTER}.weight"]  # (out, rank)
                tensor = tensor + (scale * (lora_b.float() @ lora_a.float())).to(tensor.dtype)
            name = name.replace(".base_layer.", ".")
        merged[name] = tensor
    return merged


@contextmanager
def adapter_disabled(peft_model) -> Iterator[torch.nn.Module]:
    """Inside, `peft_model` is the reference policy: the frozen base model, adapter bypassed.

        with adapter_disabled(model) as ref_model:
            ref_log_probs = score(ref_model, batch)
    """
    with peft_model.disable_adapter():
        yield peft_model


def save_adapter(peft_model, weights: dict[str, torch.Tensor], path: str | Path) -> None:
    """Write adapter_config.json and adapter_model.safetensors (the LoRA tensors only, PEFT's format, which
    `PeftModel.from_pretrained` loads) from the model's whole state dict."""
    from safetensors.torch import save_file

    adapter = {key.replace(f".{ADAPTER}.", "."): tensor.contiguous() for key, tensor in weights.items()
               if ".lora_" in key}
    Path(path).mkdir(parents=True, exist_ok=True)
    save_file(adapter, str(Path(path) / "adapter_model.safetensors"))
    peft_model.peft_config[ADAPTER].save_pretrained(str(path))


def load_adapter_weights(peft_model, path: str | Path) -> None:
    """Load the adapter saved by `save_adapter` at `path` into the (sharded) `peft_model`, in place.

    The saved adapter must have the live one's rank, alpha and target modules; the values are copied
    bit for bit, so a resumed run continues exactly (restore the optimizer state alongside).
    """
    from peft import LoraConfig
    from safetensors.torch import load_file

    from verl.utils.fsdp import load_full_state_dict

    saved, live = LoraConfig.from_pretrained(str(path)), peft_model.peft_config[ADAPTER]
    for field in ("r", "lora_alpha", "target_modules"):
        if getattr(saved, field) != getattr(live, field):
            raise ValueError(f"the adapter at {path} has {field}={getattr(saved, field)!r} but the model was "
                             f"built with {getattr(live, field)!r}; resume with the run's lora settings")
    state = {key.replace(".lora_A.", f".lora_A.{ADAPTER}.").replace(".lora_B.", f".lora_B.{ADAPTER}."): tensor
             for key, tensor in load_file(str(Path(path) / "adapter_model.safetensors")).items()}
    expected = {key for key in peft_model.state_dict() if ".lora_" in key}
    assert set(state) == expected, (sorted(set(state) ^ expected))[:4]
    load_full_state_dict(peft_model, state, strict=False)


def _lora_layers(peft_model) -> Iterator[tuple[str, torch.nn.Module]]:
    """(name in the base model, layer) for every layer that carries the adapter."""
    from peft.tuners.lora import LoraLayer

    for name, module in peft_model.get_base_model().named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


def _tied_parameters(model: torch.nn.Module) -> set[int]:
    """ids of the parameters reachable under more than one name (e.g. embed_tokens and lm_head)."""
    seen, tied = set(), set()
    for _, param in model.named_parameters(remove_duplicate=False):
        (tied if id(param) in seen else seen).add(id(param))
    return tied
