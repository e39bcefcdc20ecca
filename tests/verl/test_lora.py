import pytest
import torch
from transformers import AutoModelForCausalLM

from verl.utils.lora import adapter_disabled, apply_lora, load_adapter_weights, merge_lora, save_adapter
from verl.utils.model import load_causal_lm

LINEAR_LAYERS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


@pytest.fixture
def base_model(tiny_model_path):
    return load_causal_lm(tiny_model_path, "float32").eval()


@pytest.fixture
def input_ids(base_model) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, base_model.config.vocab_size, (2, 12), generator=generator)  # (B, T)


def logits_of(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Called the way the actor calls its model: with an explicit mask and position ids."""
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                     position_ids=torch.arange(input_ids.shape[1]).expand_as(input_ids)).logits  # (B, T, V)


def randomize_adapter(peft_model, seed: int) -> None:
    """Give lora_A and lora_B random values, as training would (a fresh B is zero)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))


def adapted_modules(peft_model) -> set[str]:
    return {name.split(".lora_A.")[0].removeprefix("base_model.model.")
            for name, _ in peft_model.named_parameters() if ".lora_A." in name}


def test_only_the_adapter_trains_and_a_fresh_adapter_changes_nothing(base_model, input_ids):
    base_logits = logits_of(base_model, input_ids)
    peft_model = apply_lora(base_model, rank=4, alpha=8, target_modules="all-linear")

    trainable = {name for name, param in peft_model.named_parameters() if param.requires_grad}
    lora = {name for name, _ in peft_model.named_parameters() if ".lora_A." in name or ".lora_B." in name}
    assert trainable == lora
    assert adapted_modules(peft_model) == {f"model.layers.{i}.{part}.{layer}" for i in range(2)
                                           for part, layers in [("self_attn", ["q_proj", "k_proj", "v_proj", "o_proj"]),
                                                                ("mlp", ["gate_proj", "up_proj", "down_proj"])]
                                           for layer in layers}  # all-linear leaves lm_head out
    assert torch.equal(logits_of(peft_model, input_ids), base_logits)


def test_target_modules_list_adapts_only_those(base_model):
    peft_model = apply_lora(base_model, rank=4, alpha=8, target_modules=["q_proj", "v_proj"])
    assert adapted_modules(peft_model) == {f"model.layers.{i}.self_attn.{layer}" for i in range(2)
                                           for layer in ["q_proj", "v_proj"]}


def test_tied_lm_head_cannot_be_adapted(base_model):
    assert base_model.config.tie_word_embeddings
    with pytest.raises(ValueError, match="tied"):
        apply_lora(base_model, rank=4, alpha=8, target_modules=["q_proj", "lm_head"])


def test_merged_weights_after_an_update_match_and_leave_the_model_unchanged(tiny_model_path, base_model,
                                                                                  input_ids):
    base_keys = set(base_model.state_dict())
    base_logits = logits_of(base_model, input_ids)
    peft_model = apply_lora(base_model, rank=4, alpha=16, target_modules="all-linear")
    base_weights = {k: v.clone() for k, v in peft_model.get_base_model().state_dict().items() if "lora_" not in k}
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    peft_model.train()
    loss = peft_model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    optimizer.step()
    peft_model.eval()
    adapted_logits = logits_of(peft_model, input_ids)
    assert not torch.allclose(adapted_logits, base_logits, atol=1e-3)  # the step moved the policy
    state_before = {k: v.clone() for k, v in peft_model.state_dict().items()}

    merged = merge_lora(peft_model.state_dict(), scale=16 / 4)

    assert set(merged) == base_keys
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    plain.load_state_dict(merged, strict=True)
    torch.testing.assert_close(logits_of(plain, input_ids), adapted_logits, atol=1e-5, rtol=0)
    assert all(torch.equal(peft_model.state_dict()[k], v) for k, v in state_before.items())
    inner_state = peft_model.get_base_model().state_dict()
    assert all(torch.equal(inner_state[k], v) for k, v in base_weights.items())  # the update left W frozen
    assert torch.equal(logits_of(peft_model, input_ids), adapted_logits)


def test_adapter_disabled_is_the_base_model(base_model, input_ids):
    base_logits = logits_of(base_model, input_ids)
    peft_model = apply_lora(base_model, rank=4, alpha=8, target_modules="all-linear")
    randomize_adapter(peft_model, seed=1)
    adapted_logits = logits_of(peft_model, input_ids)
    assert not torch.allclose(adapted_logits, base_logits, atol=1e-3)

    with adapter_disabled(peft_model) as ref_model:
        assert torch.equal(logits_of(ref_model, input_ids), base_logits)
    assert torch.equal(logits_of(peft_model, input_ids), adapted_logits)  # the adapter is back on


def test_save_and_load_adapter_roundtrip(tmp_path, tiny_model_path, input_ids):
    trained = apply_lora(load_causal_lm(tiny_model_path).eval(), rank=4, alpha=8, target_modules="all-linear")
    randomize_adapter(trained, seed=1)
    save_adapter(trained, trained.state_dict(), tmp_path)
    assert {p.name for p in tmp_path.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
    from peft import PeftModel  # PEFT's own loader reads it: the files are in PEFT's format

    loaded = PeftModel.from_pretrained(load_causal_lm(tiny_model_path).eval(), str(tmp_path))
    assert torch.equal(logits_of(loaded, input_ids), logits_of(trained, input_ids))

    resumed = apply_lora(load_causal_lm(tiny_model_path).eval(), rank=4, alpha=8, target_modules="all-linear")
    randomize_adapter(resumed, seed=2)  # any values: the load must overwrite every adapter tensor
    load_adapter_weights(resumed, tmp_path)

    assert torch.equal(logits_of(resumed, input_ids), logits_of(trained, input_ids))
    assert all(torch.equal(a, b) for a, b in zip(trained.state_dict().values(), resumed.state_dict().values()))
    other_rank = apply_lora(load_causal_lm(tiny_model_path), rank=8, alpha=8, target_modules="all-linear")
    with pytest.raises(ValueError, match="r=4"):
        load_adapter_weights(other_rank, tmp_path)


def test_merged_export_loads_as_a_plain_model(tmp_path, base_model, input_ids):
    peft_model = apply_lora(base_model, rank=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    randomize_adapter(peft_model, seed=1)
    adapted_logits = logits_of(peft_model, input_ids)

    peft_model.get_base_model().save_pretrained(tmp_path, state_dict=merge_lora(peft_model.state_dict(), 8 / 4))

    plain = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    torch.testing.assert_close(logits_of(plain, input_ids), adapted_logits, atol=1e-5, rtol=0)
    assert not any("lora" in name for name in plain.state_dict())
    assert torch.equal(logits_of(peft_model, input_ids), adapted_logits)  # the live model stays unmerged
