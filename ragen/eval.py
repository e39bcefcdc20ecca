"""Evaluate a model on the validation environments: `python -m ragen.eval --config-name sokoban model_path=...`.

`model_path` takes anything training takes: a training checkpoint
(`checkpoints/<project>/<experiment>/global_step_N`, meaning its actor), any Hugging Face folder, a hub id in the local
cache, or the bundled model. The environments are `es_manager.val` (by default the recipe's training
tags at fixed seeds; `es_manager.val.group_size=k` samples k trajectories per start state for pass@k),
sampled with `actor_rollout_ref.rollout.val_kwargs` — exactly what the trainer's validation runs. Prints
per-env success, pass@k, reward, turns and valid/effective action rates, and writes every trajectory
and the metrics next to Hydra's run files (`outputs/.../trajectories.jsonl`, `metrics.json`).
"""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from ragen.config import ConfigError, RagenConfig, validate
from ragen.train import check_overrides, make_agent, pick_scale
from verl.single_controller import LocalWorkerGroup
from verl.utils.model import ModelNotFoundError, load_tokenizer, resolve_model_path
from verl.utils.tracking import quiet_libraries, to_json, write_jsonl
from verl.workers.actor import ActorRolloutRefWorker

COLUMNS = ["success", "pass@1", "reward", "num_turns", "num_actions", "valid_action_rate", "effective_action_rate"]


def evaluate(cfg: RagenConfig, output_dir: Path) -> dict[str, float]:
    validate(cfg, world_size=1)
    cfg.actor_rollout_ref.model.path = resolve_model_path(cfg.actor_rollout_ref.model.path)
    tokenizer = load_tokenizer(cfg.actor_rollout_ref.model.path)
    if not cfg.trainer.verbose:
        quiet_libraries()
    actor_rollout_wg = LocalWorkerGroup(ActorRolloutRefWorker, cfg.actor_rollout_ref, verbose=cfg.trainer.verbose)
    actor_rollout_wg.init_model()
    rollout = make_agent(cfg, "val", actor_rollout_wg, tokenizer).rollout(0)
    write_jsonl(output_dir / "trajectories.jsonl", rollout.records)
    (output_dir / "metrics.json").write_text(to_json(rollout.metrics, indent=2), encoding="utf-8")
    val, sampling = cfg.es_manager.val, cfg.actor_rollout_ref.rollout.val_kwargs
    print(f"model {cfg.actor_rollout_ref.model.path}; {val.env_groups} start states x {val.group_size} "
          + (f"(es_manager.val), the {len(val.seeds)} seeds of es_manager.val.seeds; " if val.seeds is not None else
             f"(es_manager.val), seeds from trainer.val_seed={cfg.trainer.val_seed}; ")
          + ("greedy" if sampling.temperature == 0 else f"sampling at temperature {sampling.temperature}"))
    print(format_table(rollout.metrics))
    print(f"trajectories and metrics in {output_dir}")
    return rollout.metrics


def format_table(metrics: dict[str, float]) -> str:
    tags = sorted({key.split("/")[1] for key in metrics if key.startswith("val-env/")})
    pass_k = sorted({key.split("/")[2] for key in metrics if key.startswith("val-env/") and "pass@" in key} - {"pass@1"})
    columns = COLUMNS[:2] + pass_k + COLUMNS[2:]
    lines = [f"{'env':<26}" + "".join(f"{c:>22}" for c in columns)]
    for tag in tags:
        lines.append(f"{tag:<26}" + "".join(f"{metrics[f'val-env/{tag}/{c}']:>22.3f}" for c in columns))
    return "\n".join(lines)


@hydra.main(config_path="../config", config_name="base", version_base="1.3")
def main(cfg) -> None:
    try:
        evaluate(OmegaConf.to_object(cfg), Path(HydraConfig.get().runtime.output_dir))
    except ConfigError as e:
        sys.exit(f"config error: {e}")
    except ModelNotFoundError as e:
        sys.exit(f"model not found: {e}")


USAGE = """usage: python -m ragen.eval [--config-name RECIPE] [key=value ...]
  e.g. python -m ragen.eval --config-name sokoban model_path=checkpoints/ragen/sokoban/global_step_20
Runs the trainer's validation (es_manager.val, val_kwargs sampling) on model_path and prints a row per environment.
The keys are the training config's (ragen/config.py); `--cfg job` prints the composed config."""


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):  # Hydra's own --help would print the whole config
        print(USAGE + "\n\n" + __doc__)
        sys.exit(0)
    check_overrides()
    pick_scale()
    main()
