"""The GPU paths: FSDP over NCCL, bf16 on CUDA, flash-attention where installed. Marked `gpu`, so they
are skipped without CUDA (tests/conftest.py); run them with `python -m pytest tests/gpu -q` on a GPU machine."""

import importlib.util
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from tests.verl.workers.test_actor_critic import actor_config, make_batch
from tests.verl.workers.test_rollout_engines import ENGINES, play
from verl.single_controller import LocalWorkerGroup, RayWorkerGroup
from verl.utils.model import attention_implementation
from verl.workers.actor import ActorRolloutRefWorker
from verl.workers.rollout import SamplingParams

pytestmark = pytest.mark.gpu


def config(model_path: str, dtype: str):
    cfg = actor_config(model_path)
    cfg.model.dtype = dtype
    return cfg


def test_flash_attention_where_installed_else_sdpa():
    expected = "flash_attention_2" if importlib.util.find_spec("flash_attn") else "sdpa"
    assert attention_implementation("bfloat16") == expected
    assert attention_implementation("float32") == "sdpa"  # flash-attention computes in half precision only


def test_bf16_on_cuda_stays_close_to_fp32(tiny_model_path, tokenizer):
    batch = make_batch(tokenizer)
    log_probs, grad_norms = {}, {}
    for dtype in ("float32", "bfloat16"):
        group = LocalWorkerGroup(ActorRolloutRefWorker, config(tiny_model_path, dtype))
        group.init_model()
        assert group.worker.device.type == "cuda"
        scored = batch.union(group.compute_log_prob(batch))
        log_probs[dtype] = scored.batch["old_log_probs"]
        grad_norms[dtype] = group.update_actor(scored)["actor/grad_norm"]
    torch.testing.assert_close(log_probs["bfloat16"], log_probs["float32"], rtol=0, atol=0.1)  # ~3 digits
    assert grad_norms["bfloat16"] == pytest.approx(grad_norms["float32"], rel=0.05)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_fsdp_over_nccl_two_ranks_update_like_one(tiny_model_path, tokenizer, tmp_path):
    ray = pytest.importorskip("ray")
    batch = make_batch(tokenizer)
    one = LocalWorkerGroup(ActorRolloutRefWorker, config(tiny_model_path, "float32"))
    one.init_model()
    batch = batch.union(one.compute_log_prob(batch))
    one.update_actor(batch)
    one.save_checkpoint(str(tmp_path / "one"))
    ray.init(num_gpus=2, include_dashboard=False)
    try:
        two = RayWorkerGroup(ActorRolloutRefWorker, config(tiny_model_path, "float32"), world_size=2, num_cpus=1,
                             num_gpus=1)
        two.init_model()
        two.update_actor(batch)
        two.save_checkpoint(str(tmp_path / "two"))
    finally:
        ray.shutdown()
    a, b = (load_file(tmp_path / name / "model.safetensors") for name in ("one", "two"))
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-4)


def test_sft_on_one_gpu_lowers_the_loss(tiny_model_path, tmp_path):
    """finetune_lora.sh with 1 rank on CUDA (NCCL group, bf16): the test split's loss falls."""
    from tests.ragen.test_sft import REPO, finetune

    data = tmp_path / "data"
    subprocess.run(["bash", str(REPO / "sft" / "generate_data.sh"), "sokoban", "--train-size", "16", "--test-size",
                    "4", "--output", str(data)], check=True, capture_output=True)
    metrics = finetune(data, tiny_model_path, tmp_path / "adapter", 1)
    assert metrics[-1]["val/loss"] < metrics[0]["val/loss"] - 0.05


def test_decode_loop_gives_generates_tokens_on_cuda(tiny_model_path, tokenizer):
    """The torch decode loop against HF generate on the GPU, greedy, fp32: token for token over a multi-turn
    rollout with prefix reuse (the CPU test of the same name covers the bundled model too)."""
    sampling = SamplingParams(temperature=0, max_new_tokens=16, stop=["k"])
    runs = [play(cls(tiny_model_path, tokenizer, "float32", torch.device("cuda")), tokenizer, sampling)
            for cls in ENGINES]
    (hf_responses, _, _), (responses, _, reused) = runs
    assert responses == hf_responses
    assert reused[0] == 0 and all(n > 0 for n in reused[1:])
