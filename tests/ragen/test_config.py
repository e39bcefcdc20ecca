import pytest
from hydra.errors import ConfigCompositionException

import ragen.train
from ragen.config import ConfigError, RagenConfig, validate
from ragen.overrides import load_config


def load(recipe: str, *overrides: str) -> RagenConfig:
    return load_config(recipe, overrides, announce=True)  # as a command line does


@pytest.mark.parametrize("recipe", ["sokoban", "bandit", "frozen_lake", "countdown"])
@pytest.mark.parametrize("scale", ["cpu", "gpu"])
def test_recipes_compose_and_validate(recipe, scale):
    cfg = load(recipe, f"scale={scale}")
    validate(cfg, world_size=1)
    assert cfg.es_manager.train.env_configs.n_groups == [cfg.es_manager.train.env_groups]
    assert cfg.actor_rollout_ref.model.path == cfg.model_path


@pytest.mark.parametrize("algo", ["starpo_s", "starpo", "grpo", "rloo", "brpo", "bi_level_gae", "gigpo"])
@pytest.mark.parametrize("scale", ["cpu", "gpu"])
def test_algorithm_recipes_compose_and_validate(algo, scale):
    validate(load("base", f"scale={scale}", f"algo={algo}"), world_size=1)


def test_defaults_are_the_starpo_s_recipe():
    cfg = load("base")
    actor, algo = cfg.actor_rollout_ref.actor, cfg.algorithm
    assert (algo.adv_estimator, algo.gamma, algo.lam, algo.use_kl_in_reward) == ("gae", 1.0, 1.0, False)
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.use_kl_loss, actor.entropy_coeff) == (0.2, 0.28, False,
                                                                                                    0.001)
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.rollout_filter_strategy, rollout.rollout_filter_value, rollout.rollout_filter_type,
            rollout.rollout_filter_metric, rollout.rollout_filter_include_zero) == (
        "top_k", 0.25, "largest", "reward_variance", True)  # StarPO-S: the top 25% of groups by reward std
    assert (actor.optim.lr, cfg.critic.optim.lr) == (1e-6, 1e-5)
    assert cfg.critic.model.path == cfg.model_path  # the critic starts from the policy's weights


def test_the_bandit_recipe_is_rloo_and_an_algo_override_still_wins():
    bandit = load("bandit")
    assert bandit.algorithm.adv_estimator == "rloo" and bandit.actor_rollout_ref.rollout.rollout_filter_value == 1
    assert bandit.es_manager.val.env_configs.tags == ["Bandit", "BanditTest"]
    assert load("bandit", "algo=grpo").algorithm.adv_estimator == "grpo"


def test_the_sokoban_recipe_is_gigpo_with_ragen2s_filter_and_another_algo_drops_both():
    sokoban = load("sokoban")
    kept = sokoban.actor_rollout_ref.rollout
    assert sokoban.algorithm.adv_estimator == "gigpo" and sokoban.agent_proxy.use_turn_scores
    assert (kept.rollout_filter_strategy, kept.rollout_filter_value, kept.rollout_filter_include_zero) == (
        "top_p", 0.9, False)
    assert (sokoban.es_manager.train.env_groups, sokoban.es_manager.train.group_size) == (8, 4)
    grpo = load("sokoban", "algo=grpo")
    kept = grpo.actor_rollout_ref.rollout
    assert grpo.algorithm.adv_estimator == "grpo" and not grpo.agent_proxy.use_turn_scores
    assert (kept.rollout_filter_strategy, kept.rollout_filter_include_zero) == ("top_k", True)


def test_validation_start_states_never_overlap_training_ones():
    cfg = load("bandit")
    assert cfg.trainer.val_seed == load("bandit", "trainer.seed=7").trainer.val_seed  # independent of the seed
    validate(cfg, world_size=1)
    groups = cfg.es_manager.train.env_groups
    with pytest.raises(ConfigError, match="trainer.val_seed"):  # step 1's start states are validation states
        validate(load("bandit", f"trainer.val_seed={cfg.trainer.seed + groups}"), world_size=1)
    with pytest.raises(ConfigError, match="trainer.val_seed"):
        validate(load("bandit", "trainer.seed=999990"), world_size=1)


def test_a_list_of_validation_seeds_is_checked():
    cfg = load("sokoban")
    first = cfg.trainer.seed + cfg.es_manager.train.env_groups
    validate(load("sokoban", "es_manager.val.seeds=[7000000,3]", "es_manager.val.env_groups=2"), world_size=1)
    with pytest.raises(ConfigError, match="es_manager.val.env_groups=2"):  # one seed a group
        validate(load("sokoban", "es_manager.val.seeds=[7000000,3]"), world_size=1)
    with pytest.raises(ConfigError, match="repeats"):
        validate(load("sokoban", "es_manager.val.seeds=[5,5]", "es_manager.val.env_groups=2"), world_size=1)
    with pytest.raises(ConfigError, match="training start states"):  # step 1's first group
        validate(load("sokoban", f"es_manager.val.seeds=[7000000,{first}]", "es_manager.val.env_groups=2"),
                 world_size=1)
    with pytest.raises(ConfigError, match="es_manager.train.seeds"):
        validate(load("sokoban", "es_manager.train.seeds=[1]"), world_size=1)


def test_recipes_change_what_they_say():
    starpo = load("base", "algo=starpo")
    assert starpo.actor_rollout_ref.actor.use_kl_loss and starpo.actor_rollout_ref.actor.kl_loss_coef == 0.001
    assert starpo.actor_rollout_ref.rollout.rollout_filter_value == 1.0
    brpo = load("base", "algo=brpo").agent_proxy.reward_normalization
    assert (brpo.grouping, brpo.method) == ("batch", "mean_std")
    assert load("base", "algo=bi_level_gae").agent_proxy.use_turn_scores


def test_gpu_scale_uses_ragen_sizes():
    train = load("base", "scale=gpu").es_manager.train
    assert (train.env_groups, train.group_size) == (8, 16)


def test_veRL_style_overrides_carry_over():
    cfg = load("base", "trainer.total_training_steps=3", "algorithm.adv_estimator=grpo",
               "actor_rollout_ref.actor.clip_ratio_high=0.3", "es_manager.train.group_size=8",
               "agent_proxy.max_turn=2", "model_path=/some/model")
    assert cfg.trainer.total_training_steps == 3 and cfg.actor_rollout_ref.actor.clip_ratio_high == 0.3
    assert cfg.actor_rollout_ref.model.path == "/some/model"


@pytest.mark.parametrize("override", ["trainer.no_such_key=1", "actor_rollout_ref.actor.clip_ratio=0.2",
                                      "trainer.total_training_steps=many"])
def test_unknown_keys_and_wrong_types_fail_naming_the_key(override):
    with pytest.raises((ConfigError, ConfigCompositionException)) as error:  # unknown keys: before Hydra composes
        load("base", override)
    assert override.split("=")[0].split(".")[-1] in str(error.value.__cause__ or error.value)


@pytest.mark.parametrize("overrides, key", [
    (["actor_rollout_ref.actor.ppo_mini_batch_size=3"], "ppo_mini_batch_size"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"], "ppo_micro_batch_size_per_gpu"),
    (["es_manager.train.group_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"], "group_size"),
    (["algorithm.adv_estimator=nope"], "adv_estimator"),
    (["es_manager.train.env_configs.tags=[Nope]"], "tags"),
    (["es_manager.train.env_configs.n_groups=[1]"], "n_groups"),
    (["+custom_envs.SimpleSokoban.env_config.dim_z=3"], "dim_z"),
    (["custom_envs.SimpleSokoban.env_type=chess"], "env_type"),
    (["actor_rollout_ref.rollout.temperature=0"], "temperature"),
    (["trainer.backend=slurm"], "backend"),
    (["algorithm.adv_mask=state"], "adv_mask"),
    (["algorithm.gamma=1.5"], "gamma"),
    (["actor_rollout_ref.actor.kl_loss_type=k4"], "kl_loss_type"),
    (["actor_rollout_ref.actor.loss_agg_mode=sum"], "loss_agg_mode"),
    (["actor_rollout_ref.actor.clip_ratio_c=1.0"], "clip_ratio_c"),
    (["agent_proxy.reward_normalization.method=zscore"], "method"),
    (["agent_proxy.reward_normalization.grouping=env"], "grouping"),
    (["agent_proxy.use_turn_scores=true", "agent_proxy.reward_normalization.method=mean_std"], "use_turn_scores"),
    (["actor_rollout_ref.rollout.rollout_filter_type=var"], "rollout_filter_type"),
    (["agent_proxy.world_model_reward.prediction=0.5"], "needs agent_proxy.reply_format=world_model"),
    (["algorithm.loss_spans=[thinking]"], r"algorithm.loss_spans=\['thinking'\]: choose among"),
    (["algorithm.adv_spans=[answer,reply]"], "algorithm.adv_spans"),
    (["algorithm.loss_spans=[]"], "algorithm.loss_spans is empty"),
    (["algorithm.adv_spans=[answer]"], r"loss_spans=\['think', .* trains on kinds of text outside algorithm.adv_spans"),
    (["agent_proxy.reply_format=world_model", "agent_proxy.world_model_reward.credit=fuzzy"],
     r"world_model_reward.credit='fuzzy': choose one of \['exact', 'partial'\]"),
    (["agent_proxy.reply_format=world_model", "agent_proxy.world_model_reward.observation=nan"],
     "world_model_reward.observation must be finite"),
    (["actor_rollout_ref.rollout.rollout_filter_value=0"], "rollout_filter_value"),
    (["algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=true"], "use_kl_in_reward"),
    (["algorithm.adv_estimator=grpo", "trainer.critic_warmup=2"], "critic_warmup"),
    # the filter keeps 1 of 4 groups = 4 trajectories: fewer than a mini-batch of 8
    (["actor_rollout_ref.actor.ppo_mini_batch_size=8"], "rollout_filter"),
    (["critic.ppo_mini_batch_size=8"], "critic.ppo_mini_batch_size"),
])
def test_impossible_values_fail_at_startup_naming_the_key(overrides, key):
    cfg = load("base", "scale=cpu", *overrides)
    with pytest.raises(ConfigError, match=key):
        validate(cfg, world_size=1)


FILTER = "actor_rollout_ref.rollout.rollout_filter_"


@pytest.mark.parametrize("overrides, message", [
    ([FILTER + "strategy=top_q"], r"rollout_filter_strategy='top_q': choose one of \['min_p', 'top_k', 'top_k_abs', "
                                  r"'top_p'\]"),
    ([FILTER + "type=std_reverse"], "rollout_filter_type='std_reverse': choose largest or smallest"),
    ([FILTER + "metric=variance"], r"rollout_filter_metric='variance': choose one of \['entropy', 'entropy_std', "
                                   r"'entropy_variance', 'length', 'reward', 'reward_std', 'reward_sum', "
                                   r"'reward_variance'\]"),
    ([FILTER + "top_p_prob_mode=exp"], r"rollout_filter_top_p_prob_mode='exp': choose one of \['linear', "
                                       r"'softmax'\]"),
    ([FILTER + "strategy=top_p", FILTER + "value=-0.1"], "rollout_filter_value=-0.1 with rollout_filter_strategy"
                                                        "=top_p must be > 0"),
    ([FILTER + "strategy=top_p", FILTER + "value=nan"], "rollout_filter_value=nan"),
    ([FILTER + "value=1.5"], "rollout_filter_value=1.5 with rollout_filter_strategy=top_k must be in \\(0, 1\\]"),
    ([FILTER + "strategy=top_k_abs", FILTER + "value=0.5"], "must be a whole number >= 1"),
    ([FILTER + "strategy=top_k_abs", FILTER + "value=1.5"], "must be a whole number >= 1"),
    ([FILTER + "strategy=min_p", FILTER + "value=0"], "strategy=min_p must be in \\(0, 1\\]"),
    ([FILTER + "strategy=min_p", FILTER + "value=1.2"], "strategy=min_p must be in \\(0, 1\\]"),
    ([FILTER + "empty_stop_steps=-1"], "rollout_filter_empty_stop_steps must be >= 1, or 0"),
    ([FILTER + "selection_eps=-0.01"], "rollout_filter_selection_eps=-0.01 must be finite and >= 0"),
    # groups of one have no reward std to rank by, unless the filter keeps every group
    (["es_manager.train.group_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", FILTER + "metric=reward_std"], "group_size >= 2"),
    # top_k_abs 2 of 4 groups of 4 = 8 trajectories: not a multiple of the mini-batch of 16
    (["actor_rollout_ref.actor.ppo_mini_batch_size=16", FILTER + "strategy=top_k_abs", FILTER + "value=2"],
     "keeps 2 groups = 8 trajectories"),
])
def test_bad_rollout_filter_settings_fail_naming_the_key_and_the_choices(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(load("base", "scale=cpu", *overrides), world_size=1)


@pytest.mark.parametrize("overrides", [
    [FILTER + "strategy=top_p", FILTER + "value=0.9", FILTER + "include_zero=false"],  # RAGEN-2's recommendation
    [FILTER + "strategy=top_p", FILTER + "value=2", FILTER + "top_p_prob_mode=softmax"],  # >= 1: every group
    [FILTER + "strategy=min_p", FILTER + "value=1", FILTER + "type=smallest", FILTER + "metric=length"],
    [FILTER + "strategy=top_k_abs", FILTER + "value=1", FILTER + "metric=entropy", FILTER + "empty_stop_steps=0"],
    [FILTER + "strategy=top_k_abs", FILTER + "value=9"],  # more than the 4 groups: all of them
    ["es_manager.train.group_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=1",  # no std, but no filter
     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", FILTER + "value=1"],
    ["es_manager.train.group_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", FILTER + "metric=reward"],
])
def test_good_rollout_filter_settings_pass(overrides):
    validate(load("base", "scale=cpu", *overrides), world_size=1)


def test_the_old_filter_keys_and_values_become_todays_with_a_notice(capsys):
    cfg = load("base", FILTER + "ratio=0.5", FILTER + "type=std_rev")
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.rollout_filter_value, rollout.rollout_filter_type, rollout.rollout_filter_metric) == (
        0.5, "smallest", "reward_variance")
    notices = capsys.readouterr().err.splitlines()
    assert f"[ragen] {FILTER}ratio=0.5: RAGEN's old key, now {FILTER}value=0.5" in notices
    assert f"[ragen] {FILTER}type=std_rev: RAGEN's old value, now {FILTER}type=smallest {FILTER}metric=" \
           "reward_variance" in notices
    rollout = load("base", FILTER + "type=std", FILTER + "metric=length").actor_rollout_ref.rollout
    assert (rollout.rollout_filter_type, rollout.rollout_filter_metric) == ("largest", "length")  # the later wins
    assert load("base", FILTER + "type=smallest").actor_rollout_ref.rollout.rollout_filter_type == "smallest"


def test_batch_must_split_over_ranks():
    cfg = load("base", "scale=cpu", "actor_rollout_ref.actor.ppo_mini_batch_size=8")
    with pytest.raises(ConfigError, match="ranks"):
        validate(cfg, world_size=3)


def test_a_mix_of_environments_per_batch():
    cfg = load("base", "scale=gpu", "es_manager.train.env_configs.tags=[SimpleSokoban,FrozenLake,Countdown]",
               "es_manager.train.env_configs.n_groups=[4,2,2]")
    validate(cfg, world_size=1)
    assert cfg.es_manager.val.env_configs.tags == ["SimpleSokoban", "FrozenLake", "Countdown"]
    assert cfg.es_manager.val.env_configs.groups_per_tag(cfg.es_manager.val.env_groups) == [22, 21, 21]
    with pytest.raises(ConfigError, match=r"n_groups = \[4, 3\] must be >= 1 each and sum to es_manager.train"):
        validate(load("base", "scale=gpu", "es_manager.train.env_configs.tags=[SimpleSokoban,FrozenLake]",
                      "es_manager.train.env_configs.n_groups=[4,3]"), world_size=1)


OUT_OF_RANGE = [  # (override, the key the message must name); each once crashed, failed late or was accepted
    ("trainer.nnodes=0", "trainer.nnodes"),
    ("trainer.n_cpu_ranks_per_node=0", "trainer.n_cpu_ranks_per_node"),
    ("trainer.n_gpus_per_node=0", "trainer.n_gpus_per_node"),
    ("actor_rollout_ref.rollout.dtype=float8", "actor_rollout_ref.rollout.dtype"),
    ("actor_rollout_ref.model.dtype=float16", "actor_rollout_ref.model.dtype"),
    ("critic.model.dtype=float16", "critic.model.dtype"),
    ("actor_rollout_ref.actor.optim.betas=[0.9]", "actor_rollout_ref.actor.optim.betas"),
    ("actor_rollout_ref.actor.optim.betas=[0.9,0.999,0.5]", "actor_rollout_ref.actor.optim.betas"),
    ("actor_rollout_ref.actor.optim.betas=[1.0,0.999]", "actor_rollout_ref.actor.optim.betas"),
    ("actor_rollout_ref.actor.optim.betas=[-0.1,0.999]", "actor_rollout_ref.actor.optim.betas"),
    ("critic.optim.betas=[0.9,nan]", "critic.optim.betas"),
    ("actor_rollout_ref.actor.optim.weight_decay=-0.01", "actor_rollout_ref.actor.optim.weight_decay"),
    ("critic.optim.weight_decay=inf", "critic.optim.weight_decay"),
    ("actor_rollout_ref.rollout.top_k=-5", "actor_rollout_ref.rollout.top_k"),
    ("trainer.seed=-100", "trainer.seed"),
    ("actor_rollout_ref.actor.optim.lr=inf", "actor_rollout_ref.actor.optim.lr"),
    ("critic.optim.lr=nan", "critic.optim.lr"),
    ("es_manager.format_penalty=nan", "es_manager.format_penalty"),
    ("es_manager.format_penalty=5", "es_manager.format_penalty"),
    ("trainer.test_freq=0", "trainer.test_freq"),
    ("actor_rollout_ref.actor.entropy_coeff=-1", "actor_rollout_ref.actor.entropy_coeff"),
    ("actor_rollout_ref.actor.kl_loss_coef=inf", "actor_rollout_ref.actor.kl_loss_coef"),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps=1000000000", "actor_rollout_ref.actor.optim.lr_warmup_steps"),
    ("critic.optim.lr_warmup_steps=-1", "critic.optim.lr_warmup_steps"),
    ("actor_rollout_ref.actor.optim.total_training_steps=0", "actor_rollout_ref.actor.optim.total_training_steps"),
    ("actor_rollout_ref.rollout.val_kwargs.top_k=-5", "actor_rollout_ref.rollout.val_kwargs.top_k"),
    ("trainer.critic_warmup=-1", "trainer.critic_warmup"),
    ("trainer.critic_warmup=200", "trainer.critic_warmup"),  # = total_training_steps: the actor never trains
    ("actor_rollout_ref.actor.grad_clip=inf", "actor_rollout_ref.actor.grad_clip"),
    ("critic.grad_clip=nan", "critic.grad_clip"),
    ("actor_rollout_ref.rollout.temperature=inf", "actor_rollout_ref.rollout.temperature"),
    ("actor_rollout_ref.rollout.val_kwargs.temperature=nan", "actor_rollout_ref.rollout.val_kwargs.temperature"),
    ("actor_rollout_ref.actor.clip_ratio_c=inf", "actor_rollout_ref.actor.clip_ratio_c"),
    ("actor_rollout_ref.actor.tis_imp_ratio_cap=1.0", "actor_rollout_ref.actor.tis_imp_ratio_cap"),
    ("actor_rollout_ref.actor.tis_imp_ratio_cap=inf", "actor_rollout_ref.actor.tis_imp_ratio_cap"),
    ("algorithm.kl_ctrl.kl_coef=-0.1", "algorithm.kl_ctrl.kl_coef"),
    ("algorithm.kl_ctrl.target_kl=inf", "algorithm.kl_ctrl.target_kl"),
    ("algorithm.kl_ctrl.horizon=0", "algorithm.kl_ctrl.horizon"),
    ("algorithm.gigpo_step_weight=nan", "algorithm.gigpo_step_weight"),
    ("critic.cliprange_value=inf", "critic.cliprange_value"),
    ("trainer.logger=[console,mlflow]", "trainer.logger"),
    ("trainer.max_consecutive_nonfinite_steps=-1", "trainer.max_consecutive_nonfinite_steps"),
    ("trainer.collapse_mi_inputs=1", "trainer.collapse_mi_inputs"),
    ("trainer.collapse_mi_inputs=-2", "trainer.collapse_mi_inputs"),
    ("trainer.collapse_mi_replies=0", "trainer.collapse_mi_replies"),
    ("trainer.experiment_name=' '", "trainer.experiment_name"),
    ("ray.num_cpus_per_worker=0", "ray.num_cpus_per_worker"),
    ("ray.num_cpus_per_worker=inf", "ray.num_cpus_per_worker"),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=0",
     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"),
]


@pytest.mark.parametrize("override, key", OUT_OF_RANGE)
def test_out_of_range_values_fail_naming_the_key_and_the_range(override, key):
    cfg = load("base", "scale=cpu", override)
    with pytest.raises(ConfigError) as error:
        validate(cfg, world_size=ragen.train.world_size(cfg))  # the rank count as `run` computes it
    message = str(error.value)
    assert key in message and any(word in message for word in ("must", "choose", "use ", "give")), message


def test_float16_training_is_refused_with_the_dtypes_to_use():
    with pytest.raises(ConfigError, match="use auto, bfloat16 or float32"):
        validate(load("base", "scale=cpu", "actor_rollout_ref.model.dtype=float16"), world_size=1)


def test_the_ends_of_each_range_are_accepted():
    cfg = load("base", "scale=cpu", "trainer.test_freq=-1", "trainer.save_freq=-1", "es_manager.format_penalty=0",
               "actor_rollout_ref.rollout.top_k=0", "actor_rollout_ref.actor.entropy_coeff=0",
               "actor_rollout_ref.actor.optim.betas=[0,0.999]", "actor_rollout_ref.actor.optim.weight_decay=0",
               "actor_rollout_ref.actor.optim.lr_warmup_steps=200", "trainer.critic_warmup=199",
               "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.model.dtype=float32")
    validate(cfg, world_size=1)


@pytest.mark.parametrize("override, key", [("trainer.nnodes=0", "trainer.nnodes"),
                                           ("actor_rollout_ref.model.dtype=float16", "actor_rollout_ref.model.dtype")])
def test_run_stops_on_a_bad_config_before_any_model_loads(monkeypatch, override, key):
    def must_not_load(*args, **kwargs):
        pytest.fail("a model or tokenizer was loaded before the config was checked")

    for name in ("resolve_model_path", "load_tokenizer", "check_memory"):
        monkeypatch.setattr(ragen.train, name, must_not_load)
    with pytest.raises(ConfigError, match=key):
        ragen.train.run(load("base", "scale=cpu", override))


@pytest.mark.parametrize("override, key", [("es_manager.env_step_timeout_s=0", "es_manager.env_step_timeout_s"),
                                           ("es_manager.max_env_failure_share=1.5", "es_manager.max_env_failure_share"),
                                           ("es_manager.max_env_failure_share=nan", "es_manager.max_env_failure_share")])
def test_env_failure_limits_fail_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key):
        validate(load("base", "scale=cpu", override), world_size=1)
    validate(load("base", "scale=cpu", "es_manager.env_step_timeout_s=0.5", "es_manager.max_env_failure_share=0"),
             world_size=1)


@pytest.mark.parametrize("override, nearest", [
    ("+anything=1", "the keys at the top level are model_path, actor_rollout_ref"),
    ("++anything=1", "the keys at the top level are model_path"),
    ("+trainer.foo=1", "the keys under trainer are project_name, experiment_name"),
    ("+custom_envs.SimpleSokoban.foo=1", "the keys under custom_envs.SimpleSokoban are env_type"),
])
def test_a_plus_override_cannot_add_a_key_the_schema_lacks(override, nearest):
    # Hydra alone adds these to the structured config, and nothing would ever read them
    with pytest.raises(ConfigError, match="would add a key that nothing reads") as error:
        load("sokoban", override)
    assert nearest in str(error.value)


@pytest.mark.parametrize("override, suggestion", [
    ("trainer.experimnt_name=x", "did you mean trainer.experiment_name"),
    ("actor_rollout_ref.actor.ppo_mini_batchsize=4", "did you mean actor_rollout_ref.actor.ppo_mini_batch_size"),
    ("ppo_mini_batch_size=4", "did you mean actor_rollout_ref.actor.ppo_mini_batch_size"),
    ("custom_envs.SimpleSokoban.env_typ=sokoban", "did you mean custom_envs.SimpleSokoban.env_type"),
    ("+es_manager.trian.group_size=2", "did you mean es_manager.train.group_size"),
])
def test_a_misspelled_key_names_the_nearest_keys(override, suggestion):
    with pytest.raises(ConfigError, match="is not a config key") as error:
        load("sokoban", override)
    assert suggestion in str(error.value)


def test_keys_the_schema_leaves_open_still_pass():
    from ragen.overrides import rewrite_overrides

    passing = ["algo=grpo", "scale=gpu", "+scale=cpu", "hydra.run.dir=/tmp/x", "hydra/job_logging=disabled",
               "++custom_envs.SimpleSokoban.env_config.search_depth=40", "custom_envs.SimpleSokoban.env_type=sokoban",
               "~trainer.rollout_data_dir", "es_manager.val.env_configs.tags=[FrozenLake]"]
    assert rewrite_overrides(passing, "sokoban") == passing


def test_the_ragen_readme_command_is_translated_with_a_notice(capsys):
    # RAGEN's README: bash train.sh sokoban model.experiment_name=new_test_debug training.train_batch_size=128 ...
    cfg = load("sokoban", "model.experiment_name=new_test_debug", "training.train_batch_size=128",
               "training.ppo_batch_size=64")
    assert cfg.trainer.experiment_name == "new_test_debug"
    assert cfg.es_manager.train.env_groups == 128 and cfg.es_manager.train.env_configs.n_groups == [128]
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 64
    validate(cfg, world_size=1)
    notices = capsys.readouterr().err.splitlines()
    assert "[ragen] model.experiment_name=new_test_debug: RAGEN's old key, now trainer.experiment_name=new_test_debug" \
        in notices
    assert "[ragen] training.ppo_batch_size=64: RAGEN's old key, now actor_rollout_ref.actor.ppo_mini_batch_size=64" \
        in notices
    # Hydra's hint for the old key, `+model.experiment_name=...`, ran with the name ignored: now it is the name
    assert load("sokoban", "+model.experiment_name=mine").trainer.experiment_name == "mine"
    capsys.readouterr()
    # a library call composes quietly: only a command line prints the notices
    assert load_config("sokoban", ["model.experiment_name=quiet"]).trainer.experiment_name == "quiet"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("old, read_back, expected", [
    ("model.base_model=/some/model", lambda c: c.actor_rollout_ref.model.path, "/some/model"),
    ("model.gradient_checkpointing=false", lambda c: c.actor_rollout_ref.model.enable_gradient_checkpointing, False),
    ("training.micro_batch_size=2", lambda c: (c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu,
                                               c.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu), (2, 2)),
    ("training.n_rollout=8", lambda c: c.es_manager.train.group_size, 8),
    ("training.max_turns=3", lambda c: c.agent_proxy.max_turn, 3),
    ("max_turns=3", lambda c: c.agent_proxy.max_turn, 3),
    ("training.no_think_rl=True", lambda c: c.agent_proxy.enable_think, False),
    ("training.val_data_num=16", lambda c: c.es_manager.val.env_groups, 16),
    ("optimization.actor_lr=3e-6", lambda c: c.actor_rollout_ref.actor.optim.lr, 3e-6),
    ("optimization.kl_coef=0.04", lambda c: c.actor_rollout_ref.actor.kl_loss_coef, 0.04),
    ("optimization.adv_estimator=grpo", lambda c: c.algorithm.adv_estimator, "grpo"),
    ("system.n_gpus=4", lambda c: c.trainer.n_gpus_per_node, 4),
    ("logging.mode=console", lambda c: c.trainer.logger, ["console"]),
    ("logging.mode=['wandb']", lambda c: c.trainer.logger, ["wandb"]),
    ("logging.log_image_step_size=1", lambda c: c.logging.log_image_step_size, 1),  # the same key today
    ("env.dim_x=7", lambda c: c.custom_envs[c.es_manager.train.env_configs.tags[0]].env_config["dim_x"], 7),
    ("env.env_kwargs.search_depth=40", lambda c: c.custom_envs[c.es_manager.train.env_configs.tags[0]].env_config["search_depth"], 40),
])
def test_old_ragen_keys_set_todays(old, read_back, expected):
    assert read_back(load("sokoban", old)) == expected


def test_old_env_keys_go_to_the_recipes_environment():
    from ragen.overrides import rewrite_argv

    assert rewrite_argv(["--config-name", "frozen_lake", "env.env_kwargs.size=5", "-m"]) == [
        "--config-name", "frozen_lake", "-m", "++custom_envs.CoordFrozenLake.env_config.size=5"]
    assert load("frozen_lake", "env.env_kwargs.size=5").custom_envs["CoordFrozenLake"].env_config["size"] == 5


@pytest.mark.parametrize("old, nearest", [
    ("training.max_start_length=400", "actor_rollout_ref.rollout.max_model_len"),
    ("training.total_epochs=5", "trainer.total_training_steps"),
    ("trainer.val_only=true", "python -m ragen.eval"),
    ("env.name=sokoban", "bash train.sh <recipe>"),
    ("training.rollout_tp_size=2", "trainer.n_gpus_per_node"),
])
def test_old_keys_without_an_equivalent_stop_naming_the_nearest(old, nearest):
    with pytest.raises(ConfigError, match="no equivalent") as error:
        load("sokoban", old)
    assert nearest in str(error.value)


def test_every_old_key_leads_to_a_schema_key():
    from ragen.overrides import ENV_VARS, OLD_KEYS, Moved, is_old_key, is_schema_key

    for old, entry in OLD_KEYS.items():
        assert not is_schema_key(old), old  # an old key that is also a current one would never be translated
        if isinstance(entry, Moved):
            assert all(is_schema_key(key) for key in entry.keys), old
        else:  # the nearest names a current key, or a command
            assert entry.nearest.startswith("python -m ") or any(
                is_schema_key(word.strip("(),")) for word in entry.nearest.split()), old
    assert all(is_old_key(key) or is_schema_key(key) for key in ENV_VARS.values())


def test_the_first_readme_environment_variables_become_overrides(capsys):
    from ragen.overrides import from_env_vars

    readme = {"DATA_DIR": "data/sokoban", "DIM_X": "6", "DIM_Y": "6", "NUM_BOXES": "1", "MAX_STEPS": "5",
              "SEARCH_DEPTH": "30", "BASE_MODEL": "Qwen/Qwen2.5-0.5B", "EXPERIMENT_NAME": "test-qwen2.5-0.5b",
              "MICRO_BATCH_SIZE": "1", "TRAIN_BATCH_SIZE": "128", "PPO_BATCH_SIZE": "64", "MAX_START_LENGTH": "400",
              "MAX_RESPONSE_LENGTH": "100", "MAX_OBS_LENGTH": "120", "MAX_TURNS": "5", "NUM_UPDATE_PER_ROLL": "1",
              "LOG_MODE": "['wandb']", "GCP": "True", "N_GPUS": "1", "ROLLOUT_TP_SIZE": "1", "HOME": "/root"}
    overrides = from_env_vars(readme)
    cfg = load("sokoban", *overrides)
    assert cfg.custom_envs["CoordSokoban"].env_config == {  # the recipe's tag
        "dim_x": 6, "dim_y": 6, "num_boxes": 1, "max_steps": 5, "search_depth": 30, "cell_separator": " ",
        "observation_format": "grid_coord", "neighbours": False, "columns": False}
    assert (cfg.model_path, cfg.trainer.experiment_name) == ("Qwen/Qwen2.5-0.5B", "test-qwen2.5-0.5b")
    assert (cfg.es_manager.train.env_groups, cfg.actor_rollout_ref.actor.ppo_mini_batch_size) == (128, 64)
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 1 and cfg.agent_proxy.max_turn == 5
    assert cfg.actor_rollout_ref.rollout.response_length == 100 and cfg.trainer.logger == ["wandb"]
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing and cfg.trainer.n_gpus_per_node == 1
    ignored = [line.split("=")[0] for line in capsys.readouterr().err.splitlines() if " ignored: " in line]
    assert ignored == ["[ragen] MAX_START_LENGTH", "[ragen] MAX_OBS_LENGTH", "[ragen] ROLLOUT_TP_SIZE",
                       "[ragen] DATA_DIR"]
    assert from_env_vars({"HOME": "/root", "PATH": "/bin"}) == []  # no old variable: train.sh prints its usage


@pytest.mark.parametrize("override, message", [
    ("trainer.total_training_steps=abc", "trainer.total_training_steps=abc: trainer.total_training_steps takes an "
                                         "integer (the default is 200)"),
    ("trainer.val_before_train=maybe", "takes true or false (the default is true)"),
    ("actor_rollout_ref.actor.optim.lr=fast", "takes a number"),
    ("algo=ppo", "algo=ppo is not a choice of algo: choose one of bi_level_gae, brpo, gigpo, grpo, rloo, starpo, starpo_s "
                 "(config/algo/); did you mean algo=grpo?"),
])
def test_a_wrong_type_or_choice_is_one_line_before_hydra(override, message):
    from ragen.overrides import rewrite_overrides

    with pytest.raises(ConfigError) as refused:
        rewrite_overrides([override], "sokoban")
    assert message in str(refused.value) and "\n" not in str(refused.value)
    for fine in ("trainer.total_training_steps=7", "trainer.resumable_checkpoints=null", "algo=grpo",
                 "actor_rollout_ref.actor.optim.lr=1e-6", "trainer.logger=[jsonl]", "trainer.val_before_train=false"):
        assert rewrite_overrides([fine], "sokoban") == [fine]
