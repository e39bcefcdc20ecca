"""Shared fixtures. Nothing here reaches a hub: the tokenizer is the bundled SmolLM2's, the model is tiny."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped without one")
    config.addinivalue_line("markers", "faults: kills training runs and resumes them (tests/test_fault_injection.py)")


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


@pytest.fixture(scope="module")
def two_node_ray_cluster():
    """Two Ray nodes on this machine, a raylet each, as on two machines; the test process is not connected.
    Each node has room for several 0.5-CPU ranks, so Ray alone would pack ranks onto one node. Ray writes the
    newest cluster's address under its temp dir and a plain `ray.init()` anywhere on the machine joins that
    cluster: a private temp dir keeps other tests and runs out of this one."""
    import shutil
    import tempfile

    from ray.cluster_utils import Cluster

    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", temp_dir)
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "include_dashboard": False})
        try:
            cluster.add_node(num_cpus=4)
            cluster.wait_for_nodes()
            yield cluster
        finally:
            cluster.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)
