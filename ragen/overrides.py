"""Command-line overrides, checked before Hydra sees them: old RAGEN key names become today's, unknown keys stop.

Two things Hydra alone gets wrong for us:
- the keys of RAGEN's early `config/base.yaml` (`model.experiment_name`, `training.ppo_batch_size`, ...) and
  the environment variables of its first `train.sh` (`DIM_X`, `BASE_MODEL`, ...) fail with "Key 'model' not
  in 'RagenConfig'", and the `+model...` its hint suggests runs with the key ignored. `OLD_KEYS` is the one
  table old -> new: a key that moved is rewritten with a one-line notice, one that has no equivalent stops
  the run naming the nearest current key (`OLD_VALUES`: the same for old values of a current key);
- `+key=value` and `++key=value` add a key to the structured config even where the schema has none, and
  nothing ever reads it. Every override key must be a schema key (or under `custom_envs.<tag>.env_config`,
  which the env's own config dataclass checks in `validate`); a misspelling gets "did you mean ...".

`python -m ragen.overrides --from-env` prints the overrides the old environment variables stand for, one a
line: `train.sh` run without a recipe passes them to the sokoban recipe.
"""

import difflib
import os
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Union, get_args, get_origin, get_type_hints

from ragen.config import CONFIG_DIR, ConfigError, RagenConfig, compose_recipe

ENV_KEY_PREFIXES = ("env.env_kwargs.", "env.")  # RAGEN's env settings (Feb 2025, Jan 2025): one env's config


@dataclass(frozen=True)
class Moved:
    keys: tuple[str, ...]  # today's key(s); an old key that set several settings sets each of them
    value: Callable[[str], str] = str  # the old value as the new key takes it


@dataclass(frozen=True)
class Removed:
    nearest: str  # the nearest current key (or command)
    why: str


def moved(*keys: str, value: Callable[[str], str] = str) -> Moved:
    return Moved(keys, value)


def negated(value: str) -> str:
    return {"true": "false", "false": "true"}.get(value.lower(), value)


def as_list(value: str) -> str:
    """RAGEN's `logging.mode` took `console` or `"['wandb']"`; trainer.logger is always a list."""
    return value if value.lstrip().startswith("[") else f"[{value}]"


NO_DATASET = "there are no data files: each step draws new start states from trainer.seed"
# Keys of RAGEN's config/base.yaml (Feb 2025) and of its first train.sh (Jan 2025). `env.*` is translated
# by `env_key` into the recipe's environment, custom_envs.<tag>.env_config.*.
OLD_KEYS: dict[str, Moved | Removed] = {
    "model.base_model": moved("model_path"),
    "model.experiment_name": moved("trainer.experiment_name"),
    "model.gradient_checkpointing": moved("actor_rollout_ref.model.enable_gradient_checkpointing"),
    "training.train_batch_size": moved("es_manager.train.env_groups"),  # prompts = start states per batch
    "training.n_rollout": moved("es_manager.train.group_size"),  # responses per prompt
    "training.ppo_batch_size": moved("actor_rollout_ref.actor.ppo_mini_batch_size"),
    "training.micro_batch_size": moved("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                                       "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"),
    "training.max_response_length": moved("actor_rollout_ref.rollout.response_length"),
    "training.max_turns": moved("agent_proxy.max_turn"),
    "max_turns": moved("agent_proxy.max_turn"),
    "training.temperature": moved("actor_rollout_ref.rollout.temperature"),
    "training.use_kl_loss": moved("actor_rollout_ref.actor.use_kl_loss"),
    "training.no_think_rl": moved("agent_proxy.enable_think", value=negated),
    "training.total_training_steps": moved("trainer.total_training_steps"),
    "training.val_data_num": moved("es_manager.val.env_groups"),
    "optimization.actor_lr": moved("actor_rollout_ref.actor.optim.lr"),
    "optimization.critic_lr": moved("critic.optim.lr"),
    "optimization.kl_coef": moved("actor_rollout_ref.actor.kl_loss_coef"),
    "optimization.kl_loss_type": moved("actor_rollout_ref.actor.kl_loss_type"),
    "optimization.adv_estimator": moved("algorithm.adv_estimator"),
    "system.n_gpus": moved("trainer.n_gpus_per_node"),
    "system.multi_processing": moved("trainer.backend"),
    "logging.mode": moved("trainer.logger", value=as_list),
    "training.train_data_num": Removed("trainer.total_training_steps", NO_DATASET),
    "training.total_epochs": Removed("trainer.total_training_steps", NO_DATASET),
    "trainer.total_epochs": Removed("trainer.total_training_steps", NO_DATASET),
    "env.data_dir": Removed("trainer.seed", NO_DATASET),
    "training.val_batch_size": Removed("es_manager.val.env_groups", "validation plays its whole set as one batch"),
    "training.max_start_length": Removed("actor_rollout_ref.rollout.max_model_len",
                                         "one limit covers the whole trajectory, prompt, observations and replies"),
    "training.max_obs_length": Removed("actor_rollout_ref.rollout.max_model_len",
                                       "one limit covers the whole trajectory, prompt, observations and replies"),
    "training.rollout_tp_size": Removed("trainer.n_gpus_per_node", "the rollout has no tensor parallelism: "
                                        "more GPUs are more data-parallel ranks"),
    "training.state_masking": Removed("algorithm.adv_mask", "the loss always covers the generated tokens only"),
    "training.mask_state": Removed("algorithm.adv_mask", "the loss always covers the generated tokens only"),
    "training.binary_reward": Removed("es_manager.format_penalty", "rewards are the environment's own"),
    "training.length_penalty": Removed("es_manager.format_penalty", "there is no length penalty"),
    "training.ref_update_steps": Removed("actor_rollout_ref.actor.kl_loss_coef",
                                         "the reference policy is the initial model, never updated"),
    "training.use_sft": Removed("model_path", "fine-tune first (bash sft/finetune_lora.sh) and train from that model"),
    "rl_or_sft": Removed("model_path", "SFT is its own command (bash sft/finetune_lora.sh); RL starts from model_path"),
    "optimization.gpu_memory_utilization": Removed("actor_rollout_ref.rollout.name",
                                                   "only the vllm engine has a GPU memory share, set by itself"),
    "system.cuda_visible_devices": Removed("trainer.n_gpus_per_node", "set the CUDA_VISIBLE_DEVICES environment "
                                           "variable instead"),
    "system.vllm_attention_backend": Removed("actor_rollout_ref.rollout.name", "set the VLLM_ATTENTION_BACKEND "
                                             "environment variable instead"),
    "system.python_hash_seed": Removed("trainer.seed", "nothing depends on Python's hash seed"),
    "trainer.val_only": Removed("python -m ragen.eval", "evaluation is its own command, on the same config"),
    "trainer.default_hdfs_dir": Removed("trainer.default_local_dir", "checkpoints are written locally only"),
    "env.name": Removed("the recipe (bash train.sh <recipe>) or es_manager.train.env_configs.tags",
                        "the recipe picks the environment"),
    # RAGEN's StarPO-S filter (and ours before RAGEN-2's strategies): the ratio is the strategy's value
    "actor_rollout_ref.rollout.rollout_filter_ratio": moved("actor_rollout_ref.rollout.rollout_filter_value"),
}
FILTER = "actor_rollout_ref.rollout.rollout_filter_"
# Old values of a current key -> today's overrides: RAGEN's filter types named the score and the direction at once
OLD_VALUES: dict[tuple[str, str], tuple[str, ...]] = {
    (FILTER + "type", "std"): (FILTER + "type=largest", FILTER + "metric=reward_variance"),
    (FILTER + "type", "std_rev"): (FILTER + "type=smallest", FILTER + "metric=reward_variance"),
}

# The first README's `bash ./train.sh` read these environment variables; each stands for a key above or a
# current one. Variables without an equivalent are ignored with a notice: that README exports them all.
ENV_VARS = {
    "DIM_X": "env.dim_x", "DIM_Y": "env.dim_y", "NUM_BOXES": "env.num_boxes", "MAX_STEPS": "env.max_steps",
    "SEARCH_DEPTH": "env.search_depth", "BASE_MODEL": "model.base_model", "EXPERIMENT_NAME": "model.experiment_name",
    "MICRO_BATCH_SIZE": "training.micro_batch_size", "TRAIN_BATCH_SIZE": "training.train_batch_size",
    "PPO_BATCH_SIZE": "training.ppo_batch_size", "MAX_START_LENGTH": "training.max_start_length",
    "MAX_RESPONSE_LENGTH": "training.max_response_length", "MAX_OBS_LENGTH": "training.max_obs_length",
    "MAX_TURNS": "training.max_turns", "LOG_MODE": "logging.mode", "GCP": "model.gradient_checkpointing",
    "N_GPUS": "system.n_gpus", "ROLLOUT_TP_SIZE": "training.rollout_tp_size", "DATA_DIR": "env.data_dir",
    "NUM_UPDATE_PER_ROLL": "actor_rollout_ref.actor.ppo_epochs",
}
ENV_VAR_RECIPE = "sokoban"  # that train.sh trained Sokoban only

# Hydra's own command-line flags that take a value (`--config-name sokoban`); the rest of argv is overrides
HYDRA_VALUE_FLAGS = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--cfg", "-c",
                     "--package", "-p", "--experimental-rerun"}
HYDRA_INFO_TOPICS = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}  # `--info <topic>`


def schema_paths(schema: type = RagenConfig, prefix: str = "") -> list[str]:
    """Every dotted key of the schema. `*` is any name (a key of `custom_envs`); a path ending in `.**` is an
    open dict (`env_config`): any key below it passes here, and the env's config dataclass checks it later."""
    paths, types = [], get_type_hints(schema)
    for field in fields(schema):
        path, annotation = prefix + field.name, types[field.name]
        paths.append(path)
        if is_dataclass(annotation):
            paths += schema_paths(annotation, path + ".")
        elif get_origin(annotation) is dict:
            value_type = get_args(annotation)[1]
            paths += [path + ".*", *schema_paths(value_type, path + ".*.")] if is_dataclass(value_type) \
                else [path + ".**"]
    return paths


SCHEMA_PATHS = schema_paths()


def fits(pattern: list[str], parts: list[str]) -> bool:
    return len(pattern) == len(parts) and all(p in ("*", q) for p, q in zip(pattern, parts))


def is_schema_key(key: str) -> bool:
    parts = key.split(".")
    for path in SCHEMA_PATHS:
        *head, last = path.split(".")
        if last == "**":  # an open dict: any key below it
            if len(parts) > len(head) and fits(head, parts[:len(head)]):
                return True
        elif fits(head + [last], parts):
            return True
    return False


def concrete_keys(parts: list[str]) -> list[str]:
    """The schema keys, a `*` taking the user's name where the key leads there (custom_envs.SimpleSokoban.env_type),
    else `<name>`."""
    keys = []
    for path in SCHEMA_PATHS:
        pattern = path.split(".")
        if pattern[-1] != "**":
            keys.append(".".join(
                (parts[i] if i < len(parts) and fits(pattern[:i], parts[:i]) else "<name>")
                if p == "*" else p for i, p in enumerate(pattern)))
    return keys


def near_keys(key: str) -> list[str]:
    """Schema keys spelled like `key`: its last part among its siblings, or anywhere if spelled very alike; where
    its parent is no key (`training.x`), the whole key too."""
    parts = key.split(".")
    candidates = concrete_keys(parts)

    def last_part_like(pool: list[str], cutoff: float) -> list[str]:
        names = difflib.get_close_matches(parts[-1], {c.rpartition(".")[2] for c in pool}, n=3, cutoff=cutoff)
        return [c for name in names for c in pool if c.rpartition(".")[2] == name]

    siblings = [c for c in candidates if c.rpartition(".")[0] == ".".join(parts[:-1])]
    close = last_part_like(siblings, 0.6) + last_part_like(candidates, 0.8)
    if not siblings:
        close = difflib.get_close_matches(key, candidates, n=3, cutoff=0.6) + close
    return list(dict.fromkeys(close))[:3]


def keys_below_known_part(key: str) -> tuple[str, list[str]]:
    """The longest leading part of `key` that is a key ("": none), and the names one level below it."""
    parts = key.split(".")
    candidates = concrete_keys(parts)
    stem = next((".".join(parts[:n]) for n in range(len(parts) - 1, 0, -1) if ".".join(parts[:n]) in candidates), "")
    return stem, list(dict.fromkeys(c.rpartition(".")[2] for c in candidates if c.rpartition(".")[0] == stem))


def unknown_key_message(prefix: str, key: str) -> str:
    adds = f" (`{prefix}` would add a key that nothing reads)" if prefix.startswith("+") else ""
    if near := near_keys(key):
        hint = f"did you mean {' or '.join(near)}?"
    else:
        stem, names = keys_below_known_part(key)
        hint = f"the keys {'under ' + stem if stem else 'at the top level'} are {', '.join(names)}."
    return f"{key} is not a config key{adds}: {hint} Every key is in ragen/config.py and verl/trainer/config.py"


def is_group_or_hydra(key: str) -> bool:
    """A config group choice (`algo=grpo`, `scale=gpu`: a file of config/<group>/) or Hydra's own settings."""
    groups = {path.name for path in CONFIG_DIR.iterdir() if path.is_dir()}
    return key.split("@")[0].split("/")[0] in groups | {"hydra"} or key.startswith("hydra.")


def split_override(override: str) -> tuple[str, str, str | None]:
    """`++a.b=1` -> ("++", "a.b", "1"); `~a.b` -> ("~", "a.b", None)."""
    prefix = next(p for p in ("++", "+", "~", "") if override.startswith(p))
    key, sep, value = override[len(prefix):].partition("=")
    return prefix, key, value if sep else None


def is_old_key(key: str) -> bool:
    return key in OLD_KEYS or (key.startswith(ENV_KEY_PREFIXES) and not is_schema_key(key))


def env_key(key: str, recipe: str) -> str:
    """RAGEN's `env.dim_x` / `env.env_kwargs.dim_x` -> `custom_envs.<tag>.env_config.dim_x` of the recipe's env."""
    name = next(key[len(p):] for p in ENV_KEY_PREFIXES if key.startswith(p))
    tags = compose_recipe(recipe).es_manager.train.env_configs.tags
    if len(tags) != 1:
        raise ConfigError(f"{key} (RAGEN's old env settings) is ambiguous: recipe {recipe} trains on {tags}; set "
                          f"custom_envs.<tag>.env_config.{name} for the tag you mean")
    return f"custom_envs.{tags[0]}.env_config.{name}"


def translate(override: str, recipe: str) -> list[str]:
    """One override with an old RAGEN key -> today's override(s); a key with no equivalent stops the run."""
    prefix, key, value = split_override(override)
    assign = "" if value is None else "="
    entry = OLD_KEYS.get(key)
    if isinstance(entry, Removed):
        raise ConfigError(f"{key} is a key of RAGEN's old config with no equivalent here ({entry.why}): the "
                          f"nearest is {entry.nearest}; see docs/old-ragen.md")
    if entry is None:  # env.*: ++ as env_config holds only the keys the recipe sets (dim_x, not search_depth)
        return [("~" if prefix == "~" else "++") + env_key(key, recipe) + assign + (value or "")]
    return [("~" if prefix == "~" else "") + new + assign + (entry.value(value) if value is not None else "")
            for new in entry.keys]


def load_config(config_name: str = "base", overrides: Sequence[str] = (), announce: bool = False) -> RagenConfig:
    """Compose a recipe with overrides as `train.sh` does, for tools other than the trainer: old RAGEN keys
    translated and unknown keys refused first. `announce`: print the old keys' notices (for a command line;
    a library call composes quietly)."""
    notices: list[str] = []
    rewritten = rewrite_overrides(overrides, config_name, notices)
    if announce:
        for line in notices:
            print(line, file=sys.stderr, flush=True)
    return compose_recipe(config_name, rewritten)


def rewrite_overrides(overrides: Sequence[str], recipe: str, notices: list[str] | None = None) -> list[str]:
    """Old RAGEN keys translated (`translate`, with a notice), every other key checked against the schema.
    Group choices (`algo=grpo`) and Hydra's own `hydra.*` keys pass as they are. The notices go to `notices`,
    or to stderr when it is None (the command line)."""
    say = notices.append if notices is not None else lambda line: print(line, file=sys.stderr, flush=True)
    rewritten = []
    for override in overrides:
        prefix, key, value = split_override(override)
        if is_group_or_hydra(key):
            if (problem := choice_problem(key, value)) is not None:
                raise ConfigError(problem)
            rewritten.append(override)
        elif (key, value) in OLD_VALUES:
            new = list(OLD_VALUES[key, value])
            say(f"[ragen] {override}: RAGEN's old value, now {' '.join(new)}")
            rewritten += new
        elif is_old_key(key):
            new = translate(override, recipe)
            say(f"[ragen] {override}: RAGEN's old key, now {' '.join(new)}")
            rewritten += new
        elif is_schema_key(key):
            if value is not None and (problem := value_problem(key, value)) is not None:
                raise ConfigError(problem)
            rewritten.append(override)
        else:
            raise ConfigError(unknown_key_message(prefix, key))
    return rewritten


def choice_problem(key: str, value: str | None) -> str | None:
    """Why `value` is no choice of config group `key` (`algo=ppo`: no config/algo/ppo.yaml), or None."""
    group = CONFIG_DIR / key.split("@")[0]
    if value is None or key.startswith("hydra") or not group.is_dir() or "/" in key:
        return None
    choices = sorted(path.stem for path in group.glob("*.yaml"))
    if value in choices:
        return None
    near = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
    return (f"{key}={value} is not a choice of {key}: choose one of {', '.join(choices)} (config/{key}/)"
            + (f"; did you mean {key}={near[0]}?" if near else ""))


def schema_field(key: str, schema: type = RagenConfig) -> tuple[type, object] | None:
    """(type, default) of a scalar key of the schema, or None where the key leads into a dict or a nested
    config (checked later, by the env's config class or by Hydra)."""
    head, _, rest = key.partition(".")
    match = next((f for f in fields(schema) if f.name == head), None)
    if match is None:
        return None
    annotation = get_type_hints(schema)[head]
    if is_dataclass(annotation):
        return schema_field(rest, annotation) if rest else None
    if rest:
        return None
    default = match.default if match.default is not MISSING else None
    return annotation, default


def value_problem(key: str, value: str) -> str | None:
    """Why `value` cannot be the value of schema key `key` (`trainer.total_training_steps=abc`), or None.
    Only plain ints, floats and booleans are checked; interpolations, null and quoted text pass."""
    found = schema_field(key)
    if found is None or value.startswith(("${", "'", '"')) or value.lower() in ("null", "none", "~"):
        return None
    annotation, default = found
    if get_origin(annotation) in (Union, types.UnionType):
        scalar = [a for a in get_args(annotation) if a is not type(None)]
        annotation = scalar[0] if len(scalar) == 1 else None
    kinds = {int: "an integer", float: "a number", bool: "true or false"}
    if annotation not in kinds:
        return None
    try:
        if annotation is bool:
            ok = value.lower() in ("true", "false", "yes", "no", "on", "off")
        else:  # an int must be a whole number; a float anything float() reads (YAML's .inf too)
            number = float(value.replace("_", "").replace(".inf", "inf"))
            ok = annotation is float or number.is_integer()
    except ValueError:
        ok = False
    shown = str(default).lower() if isinstance(default, bool) else default
    return None if ok else f"{key}={value}: {key} takes {kinds[annotation]} (the default is {shown})"


def rewrite_argv(argv: Sequence[str]) -> list[str]:
    """`rewrite_overrides` on a Hydra command line (`--config-name sokoban a=1 ...`): flags first, then overrides."""
    recipe, flags, overrides, i = "base", [], [], 0
    while i < len(argv):
        arg, i = argv[i], i + 1
        if not arg.startswith("-"):
            overrides.append(arg)
            continue
        flags.append(arg)
        flag, has_value, value = arg.partition("=")
        takes_value = flag in HYDRA_VALUE_FLAGS or (flag in ("--info", "-i") and i < len(argv)
                                                    and argv[i] in HYDRA_INFO_TOPICS)
        if not has_value and takes_value and i < len(argv):
            value, i = argv[i], i + 1
            flags.append(value)
        if flag in ("--config-name", "-cn"):
            recipe = value
    rewritten = rewrite_overrides(overrides, recipe)
    check_names(rewritten)
    return flags + rewritten


NAME_KEYS = ("trainer.experiment_name", "trainer.project_name")


def check_names(overrides: Sequence[str]) -> None:
    """The run's names, before Hydra makes its output folder from `trainer.experiment_name`
    (outputs/<date>/<time>-<experiment_name>): a name that is a path would put it elsewhere."""
    from verl.utils.run_folder import check_name  # torch: keep this module light for its other users

    for override in overrides:
        _, key, value = split_override(override)
        if key in NAME_KEYS and (problem := check_name(key, value or "")) is not None:
            raise ConfigError(problem)


def from_env_vars(environ: Mapping[str, str], recipe: str = ENV_VAR_RECIPE) -> list[str]:
    """The overrides the first README's environment variables stand for, each with a one-line notice."""
    overrides = []
    for var, key in ENV_VARS.items():
        if var not in environ:
            continue
        if any(not ch.isprintable() for ch in environ[var]):  # a newline would make two overrides of one value
            raise ConfigError(f"{var}={environ[var]!r} holds a control character (a newline, a tab): an old "
                              "variable's value is one override, so it must be printable")
        entry = OLD_KEYS.get(key)
        if isinstance(entry, Removed):
            print(f"[ragen] {var}={environ[var]} ignored: {entry.why} (nearest: {entry.nearest})", file=sys.stderr)
            continue
        new = translate(f"{key}={environ[var]}", recipe) if is_old_key(key) else [f"{key}={environ[var]}"]
        print(f"[ragen] {var}={environ[var]}: RAGEN's old variable, now {' '.join(new)}", file=sys.stderr)
        overrides += new
    return overrides


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv != ["--from-env"]:
        sys.exit("usage: python -m ragen.overrides --from-env  (prints the overrides of RAGEN's old train.sh "
                 "environment variables, one a line)")
    try:
        print("\n".join(from_env_vars(os.environ)))
    except ConfigError as e:
        sys.exit(f"config error: {e}")


if __name__ == "__main__":
    main()
