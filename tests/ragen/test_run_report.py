import time

import torch

from ragen.overrides import load_config
from ragen.run_report import compute_line, print_banner, summary
from verl.utils import checkpoint


def config(run_dir, *overrides):
    return load_config("bandit", ["scale=cpu", f"trainer.default_local_dir={run_dir}",
                                  f"logging.log_image_dir={run_dir / 'log'}", *overrides])


def test_banner_says_where_everything_goes_and_how_to_start_over(tmp_path, capsys):
    print_banner(config(tmp_path), use_critic=True)
    banner = capsys.readouterr().out
    assert "from scratch (no checkpoint to resume from)" in banner
    assert "a new value head" in banner and "20 to go of 20" in banner
    for where in (f"{tmp_path}/metrics.jsonl", f"{tmp_path}/plots/", f"{tmp_path}/rollouts/",
                  f"{tmp_path}/log/index.html"):
        assert where in banner, where
    staging = checkpoint.staging_dir(tmp_path, 5)
    checkpoint.commit(staging, 5, {"step": 5, "world_size": 1}, run_config={}, keep=None)
    print_banner(config(tmp_path), use_critic=True)
    banner = capsys.readouterr().out
    assert f"resuming from {tmp_path / 'global_step_5'} (step 5)" in banner and "trainer.overwrite=true" in banner
    assert "restored from the checkpoint" in banner and "15 to go of 20" in banner


def test_summary_of_an_interrupted_run(tmp_path):
    cfg, started = config(tmp_path), time.time()
    assert "none written yet (every step and after the last: trainer.save_freq): to start over in this folder, " \
        "add trainer.overwrite=true" in summary(cfg, started)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    staging = checkpoint.staging_dir(tmp_path, 1)
    checkpoint.commit(staging, 1, {"step": 1, "world_size": 1}, run_config={}, keep=None)
    text = summary(cfg, started)
    assert text.startswith("[ragen] interrupted after step 1 of 20")
    assert f"{tmp_path / 'global_step_1'}: the same command resumes from it" in text
    assert f"{tmp_path / 'metrics.jsonl'}, steps 0-1" in text
    assert "steps 0-1" not in summary(cfg, started=time.time() + 60)  # an earlier run's metrics are not this run's


def test_summary_without_metrics_jsonl_takes_the_step_from_the_checkpoint(tmp_path):
    cfg, started = config(tmp_path, "trainer.logger=[console]"), time.time()
    staging = checkpoint.staging_dir(tmp_path, 3)
    checkpoint.commit(staging, 3, {"step": 3, "world_size": 1}, run_config={}, keep=None)
    text = summary(cfg, started)
    assert text.startswith("[ragen] interrupted after step 3 of 20") and "metrics.jsonl" not in text


def test_the_banner_names_the_dtypes_and_points_bf16_on_a_cpu_without_amx_at_fp32(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    without, with_amx = tmp_path / "cpuinfo_without", tmp_path / "cpuinfo_with"
    without.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16\n")
    with_amx.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n")
    auto = config(tmp_path)  # the default: auto
    assert compute_line(auto, without) == "actor in float32, rollout engine in float32 (auto: bf16 on a GPU or a " \
        "CPU with AMX or AMD's avx512_bf16, else fp32)"
    assert compute_line(auto, with_amx).startswith("actor in bfloat16, rollout engine in bfloat16 (auto")
    bf16 = config(tmp_path, "actor_rollout_ref.model.dtype=bfloat16", "actor_rollout_ref.rollout.dtype=bfloat16")
    line = compute_line(bf16, without)
    assert line.startswith("actor in bfloat16, rollout engine in bfloat16; ") and "fp32 may be faster" in line
    assert "actor_rollout_ref.model.dtype=auto" in line
    assert compute_line(bf16, with_amx) == "actor in bfloat16, rollout engine in bfloat16"
    engine_bf16 = config(tmp_path, "actor_rollout_ref.model.dtype=float32", "actor_rollout_ref.rollout.dtype=bfloat16")
    assert "fp32 may be faster" in compute_line(engine_bf16, without)
    assert "fp32 may be faster" not in compute_line(bf16, tmp_path / "absent")  # no /proc/cpuinfo (macOS): no guess
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert compute_line(auto, without).startswith("actor in bfloat16, rollout engine in bfloat16 (auto")
    assert "fp32 may be faster" not in compute_line(bf16, without)
