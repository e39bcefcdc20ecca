"""LoRA for RL with PEFT: one model is both the policy being trained and the frozen reference.

- `apply_lora` wraps a Hugging Face causal LM so that only the low-rank adapters train; the base weights
  stay frozen in the same module.
- The reference policy is that same model with the adapter switched off (`adapter_disabled`), which is
  exactly the initial policy, since a fresh adapter's B is zero. No second copy of the weights is loaded.
- The rollout engine knows nothing of adapters: `merged_state_dict` gives it W + (alpha / rank) * B @ A
  under the base model's own key names, computed next to the live weights, which stay unmerged.
- A checkpoint holds the adapter only (`save_adapter`, `load_adapter_weights` for resume); `save_merged`
  writes a full model folder that `AutoModelForCausalLM.from_pretrained` loads.
"""

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

ADAPTER = "default"  # PEFT's name for the single adapter we train
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
def merged_state_dict(peft_model) -> dict[str, torch.Tensor]:
    """The weights the adapted model computes with, under the base model's keys: W + (alpha / rank) * B @ A.

    The keys are exactly those of the unwrapped model's `state_dict()` (no `base_model.model.` prefix, no
    `.base_layer`, no lora_ tensors), so a rollout engine or a plain `AutoModelForCausalLM` loads them.
    The delta is computed by PEFT's own `get_delta_weight` into new tensors; the model is not touched
    (merging in place and unmerging would not restore W bit for bit). Unadapted weights are shared, not
    copied.
    """
    adapted = {f"{name}.base_layer.weight": module for name, module in _lora_layers(peft_model)}
    merged = {}
    for key, tensor in peft_model.get_base_model().state_dict().items():
        if any(part.startswith("lora_") for part in key.split(".")):
            continue
        if key in adapted:
            assert not adapted[key].merged, f"{key}: the adapter is merged in place, W already holds it"
            tensor = tensor + adapted[key].get_delta_weight(ADAPTER).to(tensor.dtype)
        merged[key.replace(".base_layer.", ".")] = tensor
    return merged


@contextmanager
def adapter_disabled(peft_model) -> Iterator[torch.nn.Module]:
    """Inside, `peft_model` is the reference policy: the frozen base model, adapter bypassed.

        with adapter_disabled(model) as ref_model:
            ref_log_probs = score(ref_model, batch)
    """
    with peft_model.disable_adapter():
        yield peft_model


def save_adapter(peft_model, path: str | Path) -> None:
    """Write adapter_config.json and adapter_model.safetensors (the LoRA tensors only) to `path`."""
    # False: never look up the base model (on the Hub) to decide whether to save the full embeddings too
    peft_model.save_pretrained(str(path), save_embedding_layers=False)


def load_adapter_weights(peft_model, path: str | Path) -> None:
    """Load the adapter saved by `save_adapter` at `path` into `peft_model`, in place, for resuming.

    The saved adapter must have the live one's rank, alpha and target modules; the values are copied
    bit for bit, so a resumed run continues exactly (restore the optimizer state alongside).
    """
    from peft import LoraConfig, set_peft_model_state_dict
    from safetensors.torch import load_file

    saved, live = LoraConfig.from_pretrained(str(path)), peft_model.peft_config[ADAPTER]
    for field in ("r", "lora_alpha", "target_modules"):
        if getattr(saved, field) != getattr(live, field):
            raise ValueError(f"the adapter at {path} has {field}={getattr(saved, field)!r} but the model was "
                             f"built with {getattr(live, field)!r}; resume with the run's lora settings")
    state = load_file(str(Path(path) / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(peft_model, state, adapter_name=ADAPTER)
    missing = [key for key in result.missing_keys if "lora_" in key]
    assert not missing and not result.unexpected_keys, (missing, result.unexpected_keys)


def save_merged(peft_model, path: str | Path) -> None:
    """Write a plain Hugging Face model folder with the merged weights; the live model stays unmerged."""
    peft_model.get_base_model().save_pretrained(str(path), state_dict=merged_state_dict(peft_model))


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
