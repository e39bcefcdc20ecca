"""Shared fixtures. Nothing here reaches a hub: the tokenizer is the bundled SmolLM2's, the model is tiny."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped without one")


def pytest_collection_modifyitems(config, items):
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def bundled_model_path() -> str:
    from verl.utils.model import resolve_model_path

    return resolve_model_path("bundled:SmolLM2-135M-Instruct")


@pytest.fixture(scope="session")
def tokenizer(bundled_model_path):
    from verl.utils.model import load_tokenizer

    return load_tokenizer(bundled_model_path)


def save_tiny_llama(path, tokenizer, **config_overrides) -> str:
    """Save a randomly initialised 2-layer Llama with the given tokenizer as an HF folder at `path`."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    settings = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                    tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                    eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(LlamaConfig(**(settings | config_overrides))).save_pretrained(path)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory, tokenizer) -> str:
    """A randomly initialised 2-layer Llama with the bundled tokenizer, saved as an HF folder."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_model"), tokenizer)
