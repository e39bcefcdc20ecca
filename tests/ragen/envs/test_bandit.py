import pytest
from gymnasium.utils.env_checker import check_env

from ragen.envs.bandit import BanditConfig, BanditEnv

INFO_KEYS = {"action_is_valid", "action_is_effective", "success"}


def make() -> BanditEnv:
    return BanditEnv(BanditConfig())


def test_passes_gymnasium_check_env():
    check_env(make())


def test_same_seed_same_start_and_both_orders_appear():
    env = make()
    starts = [env.reset(seed=seed)[0] for seed in range(20)]
    assert starts == [env.reset(seed=seed)[0] for seed in range(20)]
    assert set(starts) == {"Arms: dragon, phoenix. Choose one.", "Arms: phoenix, dragon. Choose one."}


def test_order_is_roughly_balanced_over_seeds():
    env = make()
    dragon_first = sum(env.reset(seed=seed)[0].startswith("Arms: dragon") for seed in range(400))
    assert 150 < dragon_first < 250


def test_reset_obs_is_render():
    env = make()
    obs, info = env.reset(seed=3)
    assert obs == env.render()
    assert info == {}


def test_safe_arm_pays_steady_reward_and_is_not_success():
    env = make()
    for seed in range(50):
        env.reset(seed=seed)
        obs, reward, terminated, truncated, info = env.step("phoenix")
        assert reward == 0.1 and type(reward) is float
        assert terminated and not truncated
        assert info == {"action_is_valid": True, "action_is_effective": True, "success": False}
        assert "You pulled phoenix" in obs


def test_risky_arm_mean_reward_and_success():
    env = make()
    rewards = []
    for seed in range(4000):
        env.reset(seed=seed)
        _, reward, terminated, _, info = env.step("dragon")
        assert terminated and info["success"] and set(info) == INFO_KEYS
        rewards.append(reward)
    assert set(rewards) == {0.0, 1.0}
    # Standard error of the mean is sqrt(0.25 * 0.75 / 4000) ~ 0.007.
    assert sum(rewards) / len(rewards) == pytest.approx(0.25, abs=0.03)


def test_action_matched_ignoring_case_and_whitespace():
    env = make()
    env.reset(seed=0)
    _, _, terminated, _, info = env.step("  DrAgOn\n")
    assert terminated and info["action_is_valid"] and info["success"]


@pytest.mark.parametrize("action", ["tiger", "", "dragon phoenix", "Left", "dragons", "griffin"])
def test_invalid_action_leaves_state_unchanged(action):
    env = make()
    obs, _ = env.reset(seed=1)
    next_obs, reward, terminated, truncated, info = env.step(action)
    assert next_obs == obs == env.render()
    assert reward == 0.0 and not terminated and not truncated
    assert info == {"action_is_valid": False, "action_is_effective": False, "success": False}
    # The episode is still open: a valid pull afterwards ends it.
    assert env.step("phoenix")[2]


def test_custom_arms_and_instructions_name_them():
    env = BanditEnv(BanditConfig(safe_arm_name="ant", risky_arm_name="bee", risky_reward=2.0, risky_prob=0.5))
    assert "ant" in env.instructions and "bee" in env.instructions and "dragon" not in env.instructions


@pytest.mark.parametrize("safe, risky", [("phoenix", "dragon"), ("griffin", "dragon"), ("unicorn", "Griffin")])
def test_the_format_example_names_no_arm(safe, risky):
    """Before training the model copies the example: naming the safe arm there made it the only arm sampled."""
    env = BanditEnv(BanditConfig(safe_arm_name=safe, risky_arm_name=risky))
    env.reset(seed=0)
    assert len(env.example_actions) == 1
    assert env.example_actions[0].lower() not in {safe.lower(), risky.lower()}
    assert not env.step(env.example_actions[0])[4]["action_is_valid"]
    swapped = BanditEnv(BanditConfig(safe_arm_name=risky, risky_arm_name=safe))
    assert (swapped.instructions, swapped.example_actions) == (env.instructions, env.example_actions)


@pytest.mark.parametrize("answer, arm", [("dragon", "dragon"), ("I choose Dragon.", "dragon"),
                                         ("phoenix is my pick", "phoenix"), ("(phoenix)", "phoenix")])
def test_an_answer_naming_exactly_one_arm_pulls_it(answer, arm):
    env = make()
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step(answer)
    assert terminated and info["action_is_valid"] and f"You pulled {arm}" in obs


def test_instructions_do_not_reveal_the_risky_arm_by_order():
    swapped = BanditEnv(BanditConfig(safe_arm_name="dragon", risky_arm_name="phoenix", risky_reward=1.0))
    assert swapped.instructions == make().instructions


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"safe_reward": 0.3}, "risky_prob * risky_reward"),
        ({"risky_prob": 1.5}, "risky_prob"),
        ({"risky_arm_name": "Phoenix"}, "risky_arm_name"),
        ({"risky_arm_name": "red phoenix"}, "names the other"),  # "red phoenix" names phoenix too
        ({"safe_arm_name": " "}, "safe_arm_name"),
    ],
)
def test_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=field.replace("*", r"\*")):
        BanditConfig(**kwargs)
