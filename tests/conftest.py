"""Shared fixtures. Nothing here reaches a hub: the tokenizer is the bundled SmolLM2's, the model is tiny."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_configure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ... under `pytest -n N`
    if worker is not None:
        pin_to_a_share_of_the_cores(int(worker.removeprefix("gw")), int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped without one")
    config.addinivalue_line("markers", "faults: kills training runs and resumes them (tests/test_fault_injection.py)")


def pin_to_a_share_of_the_cores(worker: int, workers: int) -> None:
    """Run test worker `worker` of `workers` (pytest-xdist) and every process it starts on its own share of the
    cores. Unpinned, two workers' torch thread pools and training subprocesses contend for the same cores, and a
    thread pool that loses its cores slows several-fold (the bandit learning test took 808 s instead of 154 s
    beside another worker). The ranks' thread counts follow the share (`Worker` reads the affinity)."""
    import torch

    cores = sorted(os.sched_getaffinity(0))
    share = set(cores[worker % len(cores)::workers])
    os.sched_setaffinity(0, share)
    torch.set_num_threads(len(share))


def pytest_collection_modifyitems(config, items):
    import torch

    if not torch.cuda.is_available():
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
    # The learning tests first: they take minutes each, so under `pytest -n 2` the other worker shares out the
    # rest meanwhile, instead of one of them running alone at the end; a serial run fails fast on them.
    items.sort(key=lambda item: item.path.name != "test_learning.py")  # stable: otherwise collection order


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


def save_tiny_qwen_vl(path, tokenizer, family: str = "qwen2_vl") -> str:
    """A randomly initialised 2-layer Qwen2-VL or Qwen2.5-VL (`family`; M-RoPE) with the bundled tokenizer and
    its three picture tokens,
    8-pixel patches merged 2 x 2: one image token per 16-pixel board cell. Saved with its tokenizer and image
    processor (its processor class would need torchvision, which is not installed: `MRopeProcessor`)."""
    import copy

    import torch
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig,
                              Qwen2VLForConditionalGeneration)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]},
                                 replace_extra_special_tokens=False)
    ids = tokenizer.convert_tokens_to_ids
    text = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id)
    vision = dict(depth=1, num_heads=2, patch_size=8, spatial_merge_size=2, temporal_patch_size=1)
    if family == "qwen2_vl":
        config_class, model_class = Qwen2VLConfig, Qwen2VLForConditionalGeneration
        vision |= dict(embed_dim=32, hidden_size=64)
    else:  # Qwen2.5-VL: windowed attention in the tower, a wider output
        config_class, model_class = Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
        vision |= dict(hidden_size=32, intermediate_size=64, out_hidden_size=64, window_size=32,
                       fullatt_block_indexes=[0])
    config = config_class(text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
                           vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
                           tie_word_embeddings=True)
    torch.manual_seed(0)
    model_class(config).save_pretrained(path)
    Qwen2VLImageProcessorPil(patch_size=8, merge_size=2, temporal_patch_size=1, min_pixels=16 * 16,
                             max_pixels=256 * 256).save_pretrained(path)
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
