"""The HTML trajectory browser: paths, index, pictures redrawn from text states, reply markup, escaping,
strict JSON (null for NaN) and UTF-8 whatever the locale."""

import base64
import html
import io
import json
import os
import re
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from ragen.config import CustomEnvConfig
from ragen.envs import make_env
from ragen.envs.utils import TILE
from ragen.trajectory_browser import main, pick_trajectories, reply_html, write_index, write_step
from verl.protocol import DataProto
from verl.utils.tracking import write_jsonl

REPO = Path(__file__).resolve().parents[2]

CUSTOM_ENVS = {
    "SimpleSokoban": CustomEnvConfig("sokoban", 10, {"dim_x": 6, "dim_y": 6}),
    "SokobanDifferentGridVocab": CustomEnvConfig("sokoban", 10, {"dim_x": 7, "dim_y": 6, "symbols": "W.T*BAa"}),
    "FrozenLake": CustomEnvConfig("frozen_lake", 20, {"size": 4, "is_slippery": False}),
    "CoordSokoban": CustomEnvConfig("sokoban", 10, {"dim_x": 6, "dim_y": 6, "cell_separator": " ",
                                                    "observation_format": "grid_coord"}),
    "CoordFrozenLake": CustomEnvConfig("frozen_lake", 20, {"size": 4, "is_slippery": False, "cell_separator": " ",
                                                           "observation_format": "grid_coord"}),
    "Bandit": CustomEnvConfig("bandit", 1, {}),
}
HOSTILE = """<script>alert(1)</script><img src=x onerror=alert(2)> "double" 'single' </textarea></script>"""
PNG_PREFIX = "data:image/png;base64,"


def play(tag: str, actions: list[str], *, env_id: int = 0, group_id: int = 0, seed: int = 0, step: int = 1,
         reply: str = "<think>I think {action} is right.</think><answer>{action}</answer>") -> dict:
    """A record as AgentProxy writes it, one action per turn, from a real env (`advantage` included)."""
    spec = CUSTOM_ENVS[tag]
    env = make_env(spec.env_type, spec.env_config)
    obs, _ = env.reset(seed=seed)
    turns, total, success = [], 0.0, False
    for action in actions:
        shown = obs
        obs, reward, terminated, truncated, info = env.step(action)
        total, success = total + reward, info["success"]
        turns.append({"state": shown, "response": reply.format(action=action), "format_ok": True,
                      "actions": [action], "action_valid": [info["action_is_valid"]],
                      "action_effective": [info["action_is_effective"]], "reward": reward,
                      "done": terminated or truncated, "advantage": 0.25})
        if terminated or truncated:
            break
    return {"step": step, "split": "train", "env_id": env_id, "group_id": group_id, "tag": tag, "seed": seed,
            "turns": turns, "success": success, "reward": total, "context_truncated": False, "final_state": obs}


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text (script text kept apart)."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text, self.scripts, self._in_script = [], [], False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        (self.scripts if self._in_script else self.text).append(data)

    def find(self, tag: str) -> list[dict]:
        return [attrs for name, attrs in self.tags if name == tag]


def png_size(uri: str) -> tuple[int, int]:
    """(width, height) from the PNG's IHDR chunk."""
    data = base64.b64decode(uri.removeprefix(PNG_PREFIX))
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def images(page: Path) -> list[str]:
    return [attrs["src"] for attrs in Elements(page.read_text()).find("img")]


def index_rows(experiment: Path) -> list[dict]:
    """The trajectories the index's script reads."""
    return json.loads(Elements((experiment / "index.html").read_text()).scripts[0])


def test_pages_are_written_where_ragen_puts_them_and_the_index_lists_every_step(tmp_path):
    experiment = tmp_path / "log" / "exp"
    step_1 = [play("SimpleSokoban", ["Up"], env_id=i, group_id=i // 3, seed=i // 3) for i in range(6)]
    step_2 = [play("Bandit", ["phoenix"], env_id=i, group_id=i, seed=i, step=2) for i in range(2)]

    paths = write_step(step_1, experiment, 1, 4, CUSTOM_ENVS)
    paths += write_step(step_2, experiment, 2, -1, CUSTOM_ENVS)
    write_index(experiment)

    # two groups of three: taken in turn (0, 3, 1, 4), written in batch order
    assert paths == [experiment / f"step_{s}/trajectory_data_{i}.html" for s, i in
                     [(1, 0), (1, 1), (1, 3), (1, 4), (2, 0), (2, 1)]]
    assert all(p.is_file() for p in paths)
    assert [r["page"] for r in index_rows(experiment)] == [str(p.relative_to(experiment)) for p in paths]
    assert [(r["step"], r["id"], r["tag"]) for r in index_rows(experiment)][3:5] == \
        [(1, 4, "SimpleSokoban"), (2, 0, "Bandit")]
    # neighbours and the way back are relative links
    links = [a["href"] for a in Elements(paths[1].read_text()).find("a")]
    assert links == ["../index.html", "trajectory_data_0.html", "trajectory_data_3.html"]


@pytest.mark.parametrize("steps, train_pages", [(2, ["step_1", "step_2"]), (6, ["step_1", "step_4", "step_6"])])
def test_a_run_writes_its_first_and_last_steps_and_every_validation(tmp_path, steps, train_pages):
    from ragen.overrides import load_config
    from ragen.train import trajectory_pages

    cfg = load_config("bandit", [f"trainer.total_training_steps={steps}", "logging.log_image_step_size=4",
                                 f"logging.log_image_dir={tmp_path}", "logging.log_n_image_per_batch=-1"])
    on_records = trajectory_pages(cfg)

    def rollout(split: str, step: int, seeds: list[int]) -> list[dict]:
        return [play("Bandit", ["phoenix"], env_id=i, group_id=i, seed=seed, step=step) | {"split": split}
                for i, seed in enumerate(seeds)]

    # the trainer's calls (PPOTrainer.fit): validation before training, every step's rollout, validation after
    # the last; validation plays the same start states every time, training new ones every step
    on_records(rollout("val", 0, [900, 901]), "val", 0)
    for step in range(1, steps + 1):
        on_records(rollout("train", step, [10 * step, 10 * step + 1]), "train", step)
    on_records(rollout("val", steps, [900, 901]), "val", steps)

    experiment = tmp_path  # logging.log_image_dir: the pages, no folder per experiment
    assert sorted(p.name for p in experiment.iterdir() if p.is_dir()) == \
        sorted(train_pages + ["val_step_0", f"val_step_{steps}"])
    rows = index_rows(experiment)
    val_rows = [(r["step"], r["id"], r["seed"]) for r in rows if r["split"] == "validation"]
    assert val_rows == [(0, 0, 900), (0, 1, 901), (steps, 0, 900), (steps, 1, 901)]  # one level, two steps
    assert [r["page"] for r in rows if r["split"] == "validation"] == \
        [f"val_step_{s}/trajectory_data_{i}.html" for s in (0, steps) for i in (0, 1)]
    assert sorted({r["page"].split("/")[0] for r in rows if r["split"] == "train"}) == sorted(train_pages)
    assert all((experiment / r["page"]).is_file() for r in rows)
    # training before validation within a step
    assert [r["split"] for r in rows if r["step"] == steps] == ["train"] * 2 + ["validation"] * 2
    title = Elements((experiment / "val_step_0" / "trajectory_data_1.html").read_text()).text[0]
    assert title == "Bandit · step 0 · env 1 · validation"


def test_rewriting_a_step_drops_its_old_pages(tmp_path):
    records = [play("Bandit", ["phoenix"], env_id=i, group_id=i, seed=i) for i in range(4)]
    write_step(records, tmp_path, 1, -1, CUSTOM_ENVS)
    write_step(records, tmp_path, 1, 2, CUSTOM_ENVS)
    assert sorted(p.name for p in (tmp_path / "step_1").glob("*.html")) == \
        ["trajectory_data_0.html", "trajectory_data_1.html"]


def test_pick_spreads_over_groups_and_keeps_batch_order():
    records = [{"env_id": i, "group_id": i // 4} for i in range(12)]
    assert [r["env_id"] for r in pick_trajectories(records, 5)] == [0, 1, 4, 5, 8]
    assert [r["env_id"] for r in pick_trajectories(records, -1)] == list(range(12))


@pytest.mark.parametrize("tag, actions", [("SimpleSokoban", ["Up", "Left", "Down"]),
                                          ("SokobanDifferentGridVocab", ["Right", "Down"]),
                                          ("FrozenLake", ["Right", "Down", "Right"]),
                                          ("CoordSokoban", ["Up", "Left", "Down"]),  # coordinates, spaced cells
                                          ("CoordFrozenLake", ["Right", "Down", "Right"])])
def test_grid_states_are_drawn_as_the_envs_own_pictures(tmp_path, tag, actions):
    record = play(tag, actions, seed=3)
    page = write_step([record], tmp_path, 1, -1, CUSTOM_ENVS)[0]
    uris = images(page)
    assert len(uris) == len(record["turns"]) + 1  # every turn's state and the final one

    spec = CUSTOM_ENVS[tag]
    env = make_env(spec.env_type, spec.env_config)
    env.render_mode = "rgb_array"
    env.reset(seed=3)
    expected = [env.render()]  # the state before each turn, then the final state
    for action in actions[:len(record["turns"])]:
        env.step(action)
        expected.append(env.render())
    for uri, picture in zip(uris, expected):
        assert uri.startswith(PNG_PREFIX)
        assert png_size(uri) == (picture.shape[1], picture.shape[0])
        assert picture.shape[0] % TILE == 0
    image_module = pytest.importorskip("PIL.Image")  # an independent decoder for the pixels themselves
    for uri, picture in zip(uris, expected):
        decoded = image_module.open(io.BytesIO(base64.b64decode(uri.removeprefix(PNG_PREFIX))))
        assert decoded.mode == "RGB"
        np.testing.assert_array_equal(np.asarray(decoded), picture)


def test_text_envs_and_unknown_tags_show_the_state_as_text(tmp_path):
    bandit = play("Bandit", ["phoenix"])
    stranger = play("SimpleSokoban", ["Up"], env_id=1, group_id=1) | {"tag": "NotInConfig"}
    pages = write_step([bandit, stranger], tmp_path, 1, -1, CUSTOM_ENVS)
    for page, record in zip(pages, [bandit, stranger]):
        assert images(page) == []
        assert record["turns"][0]["state"] in "".join(Elements(page.read_text()).text)


def test_think_and_answer_are_marked_apart():
    parsed = Elements(reply_html("<think>push the box</think> <answer>Up || Left</answer>trailing"))
    assert [attrs["class"] for _, attrs in parsed.tags] == \
        ["tag", "think", "tag", "outside", "tag", "answer", "tag", "outside"]
    assert parsed.text == ["<think>", "push the box", "</think>", " ", "<answer>", "Up || Left", "</answer>",
                           "trailing"]
    # an unclosed think still reads as thinking
    assert [a["class"] for _, a in Elements(reply_html("<think>never closed")).tags] == ["tag", "think"]


def test_turn_facts_show_validity_reward_and_advantage(tmp_path):
    record = play("SimpleSokoban", ["Up", "Jump"], seed=1)
    record["turns"][1] |= {"advantage": None, "format_ok": False}
    text = "".join(Elements(write_step([record], tmp_path, 1, -1, CUSTOM_ENVS)[0].read_text()).text)
    assert "advantage+0.250" in text and "advantagefiltered out" in text
    assert "Jump invalid" in text and "malformed (format penalty)" in text
    assert f"reward{record['turns'][0]['reward']:+.3g}" in text
    assert "world model" not in text  # only a run with agent_proxy.world_model_reward scores the written states
    record["turns"][0]["world_model"] = {"observation": 1.0, "prediction": 0.5, "reward": 0.75}
    text = "".join(Elements(write_step([record], tmp_path, 2, -1, CUSTOM_ENVS)[0].read_text()).text)
    assert "world modelobservation 1.00, prediction 0.50, reward +0.75" in text



# one span per token: its class, style, title and (escaped) text
TOKEN_SPAN = re.compile(r'<span class="(on|off)"(?: style="([^"]*)")? title="([^"]*)">([^<]*)</span>')


def token_spans(page: Path) -> list[tuple[str, str, str, str]]:
    section = page.read_text(encoding="utf-8").split('<section class="turn tokens">')[1]
    return [(kind, style, title, html.unescape(text)) for kind, style, title, text in TOKEN_SPAN.findall(section)]


def test_the_tokens_trained_on_are_marked_with_their_advantage(tmp_path):
    record = play("Bandit", ["phoenix"])
    record["token_pieces"] = ["<|im_start|>", "a<b", " & c", "Up", "</answer>", "\n"]
    record["trained_tokens"] = {"spans": [[2, 4], [5, 6]], "advantages": [0.5, -0.25, 0.0]}
    (page,) = write_step([record], tmp_path, 1, -1, CUSTOM_ENVS)
    assert token_spans(page) == [
        ("off", "", "token 0: not trained on", "<|im_start|>"),
        ("off", "", "token 1: not trained on", "a<b"),
        ("on", "background: rgba(33, 102, 172, 0.80)", "token 2: trained on, advantage +0.500", " & c"),  # blue
        ("on", "background: rgba(178, 24, 43, 0.40)", "token 3: trained on, advantage -0.250", "Up"),  # red, half
        ("off", "", "token 4: not trained on", "</answer>"),
        ("on", "background: rgba(33, 102, 172, 0.00)", "token 5: trained on, advantage +0.000", "\n")]
    text = page.read_text(encoding="utf-8")
    assert "a&lt;b" in text and " &amp; c" in text and "<|im_start|>" not in text  # token text is escaped
    assert "Tokens: 3 of 6 trained on" in text
    assert ">-0.500</span>" in text and ">+0.500</span>" in text  # the legend's scale: the largest advantage
    record["trained_tokens"]["updated"] = False  # a zero-variance step: advantages computed, no actor update
    (page,) = write_step([record], tmp_path, 1, -1, CUSTOM_ENVS)
    assert "but the actor took no update this step" in page.read_text(encoding="utf-8")


def test_a_filtered_trajectory_shows_no_token_trained_on_and_validation_no_tokens(tmp_path):
    filtered = play("Bandit", ["phoenix"]) | {"token_pieces": ["a", "b"], "trained_tokens": None}
    validation = play("Bandit", ["phoenix"], env_id=1, group_id=1) | {"split": "val"}
    (page,) = write_step([filtered], tmp_path, 1, -1, CUSTOM_ENVS)
    assert token_spans(page) == [("off", "", "token 0: not trained on (filtered)", "a"),
                                 ("off", "", "token 1: not trained on (filtered)", "b")]
    assert "Tokens: not trained on (filtered)" in page.read_text(encoding="utf-8")
    (page,) = write_step([validation], tmp_path, 1, -1, CUSTOM_ENVS, "val")
    assert 'class="turn tokens"' not in page.read_text(encoding="utf-8")


def test_the_agent_loops_tokens_and_the_trainers_mask_line_up(tokenizer, tmp_path):
    """Real records: the pieces join to the trajectory's text (the Sokoban legend's "√" is split over two
    tokens), and the trainer's spans of loss_mask cover exactly each turn's reply, as generated."""
    from tests.ragen.test_agent_proxy import make_proxy
    from verl.trainer.ppo_trainer import with_advantages

    proxy, policy = make_proxy(tokenizer, "SimpleSokoban", CUSTOM_ENVS["SimpleSokoban"],
                               "try</think><answer>Up</answer>", max_turn=2)
    rollout = proxy.rollout(step=3)
    batch, reply = rollout.batch, tokenizer.decode(policy.ids)  # the reply's ids, end of sequence included
    lengths = batch.batch["attention_mask"].sum(-1).tolist()
    for record, ids, n in zip(rollout.records, batch.batch["input_ids"].tolist(), lengths):
        assert "".join(record["token_pieces"]) == tokenizer.decode(ids[:n], clean_up_tokenization_spaces=False)
        assert "\N{SQUARE ROOT}" in "".join(record["token_pieces"])
        assert not any("\ufffd" in piece for piece in record["token_pieces"])
    kept = batch.union(DataProto(batch={"advantages": batch.batch["loss_mask"] * 0.5,
                                        "adv_mask": batch.batch["loss_mask"]},
                                 non_tensor_batch={"record_index": np.arange(len(batch))}))[[0, 1]]  # two kept
    records = with_advantages(rollout.records, kept)
    for record in records[:2]:
        spans = record["trained_tokens"]["spans"]
        assert [end - start for start, end in spans] == [len(policy.ids)] * len(record["turns"])
        assert all("".join(record["token_pieces"][start:end]) == reply for start, end in spans)
    assert records[2]["trained_tokens"] is None
    pages = write_step(records, tmp_path, 3, -1, CUSTOM_ENVS)
    assert [sum(kind == "on" for kind, *_ in token_spans(page)) for page in pages] == \
        [int(batch.batch["loss_mask"][i].sum()) for i in (0, 1)] + [0, 0]


def test_model_and_env_text_is_escaped_everywhere(tmp_path):
    hostile = play("Bandit", ["phoenix"], reply=HOSTILE + "<answer>{action}</answer>") | {"tag": HOSTILE}
    hostile["turns"][0] |= {"state": HOSTILE, "actions": [HOSTILE]}
    hostile["final_state"] = HOSTILE
    grid = play("SimpleSokoban", ["Up"], env_id=1, group_id=1, reply=HOSTILE)
    grid["turns"][0]["state"] = HOSTILE  # a grid tag whose state is not a grid
    write_step([hostile, grid], tmp_path, 1, -1, CUSTOM_ENVS)
    index = write_index(tmp_path)

    for path in [index, *tmp_path.glob("step_1/*.html")]:
        page = Elements(path.read_text())
        scripts = page.find("script")
        expected = [{"type": "application/json", "id": "trajectories"}, {}] if path == index else []
        assert scripts == expected, path
        assert not [(tag, name) for tag, attrs in page.tags for name in attrs if name.startswith("on")], path
        assert all(attrs["src"].startswith(PNG_PREFIX) for attrs in page.find("img")), path
        if path != index:
            assert HOSTILE in "".join(page.text)  # shown, as text
    embedded = Elements(index.read_text()).scripts[0]
    assert "</" not in embedded and "<script" not in embedded
    rows = json.loads(embedded)
    assert rows[0]["tag"] == HOSTILE and HOSTILE in rows[1]["text"]


def test_nothing_is_loaded_from_the_network(tmp_path):
    records = [play(tag, ["Up", "Right"], env_id=i, group_id=i) for i, tag in
               enumerate(["SimpleSokoban", "FrozenLake"])]
    write_step(records, tmp_path, 1, -1, CUSTOM_ENVS)
    write_index(tmp_path)
    for path in tmp_path.rglob("*.html"):
        text = path.read_text()
        assert "http://" not in text and "https://" not in text and "//" not in text.replace("://", ""), path
        page = Elements(text)
        assert not page.find("link") and all(a["href"].endswith(".html") for a in page.find("a")), path
        assert all(a["src"].startswith(PNG_PREFIX) for a in page.find("img")), path


def test_records_from_the_agent_loop_make_pages(tokenizer, tmp_path):
    from tests.ragen.test_agent_proxy import make_proxy

    proxy, _ = make_proxy(tokenizer, "SimpleSokoban", CUSTOM_ENVS["SimpleSokoban"],
                          "try</think><answer>Up</answer>", max_turn=2)
    records = proxy.rollout(step=3).records
    pages = write_step(records, tmp_path, 3, 2, CUSTOM_ENVS)
    assert [p.name for p in pages] == ["trajectory_data_0.html", "trajectory_data_2.html"]  # one per group
    assert len(images(pages[0])) == len(records[0]["turns"]) + 1


def test_command_line_builds_the_browser_from_saved_records(tmp_path, capsys):
    rollouts = tmp_path / "run" / "rollouts" / "train"
    rollouts.mkdir(parents=True)
    for step in (2, 10):
        records = [play("SimpleSokoban", ["Up"], env_id=i, group_id=i, seed=i, step=step) for i in range(3)]
        (rollouts / f"step_{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "log" / "exp"

    main([str(rollouts), str(out), "--n-per-batch", "2"])

    assert [(r["step"], r["id"]) for r in index_rows(out)] == [(2, 0), (2, 1), (10, 0), (10, 1)]
    assert len(images(out / "step_10" / "trajectory_data_1.html")) == 2
    assert "wrote 4 trajectory pages from 2 steps" in capsys.readouterr().out


def test_command_line_puts_validation_records_beside_the_training_ones(tmp_path):
    out = tmp_path / "log" / "exp"
    for split in ("train", "val"):
        records = [play("Bandit", ["phoenix"], env_id=i, group_id=i, seed=i) | {"split": split} for i in range(2)]
        write_jsonl(tmp_path / "rollouts" / split / "step_4.jsonl", records)
        main([str(tmp_path / "rollouts" / split), str(out)])
    assert [(r["split"], r["page"]) for r in index_rows(out)] == \
        [("train", "step_4/trajectory_data_0.html"), ("train", "step_4/trajectory_data_1.html"),
         ("validation", "val_step_4/trajectory_data_0.html"), ("validation", "val_step_4/trajectory_data_1.html")]


def strict_json(text: str):
    """json.loads that rejects the bare NaN and Infinity JSON.parse rejects in the browser."""
    def reject(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=reject)


def test_a_non_finite_reward_is_null_in_the_index_and_n_a_on_its_page(tmp_path):
    record = play("Bandit", ["phoenix"])
    record["reward"] = record["turns"][0]["reward"] = float("nan")
    (page,) = write_step([record], tmp_path, 1, -1, CUSTOM_ENVS)
    index = write_index(tmp_path)
    assert strict_json((tmp_path / "step_1" / "trajectories.json").read_text(encoding="utf-8"))[0]["reward"] is None
    assert strict_json(Elements(index.read_text(encoding="utf-8")).scripts[0])[0]["reward"] is None
    assert page.read_text(encoding="utf-8").count("<dt>reward</dt><dd>n/a</dd>") == 2  # the trajectory's, the turn's


def test_command_line_reads_nulls_and_skips_a_torn_last_line(tmp_path):
    rollouts = tmp_path / "rollouts" / "train"
    records = [play("Bandit", ["phoenix"], env_id=i, group_id=i, seed=i) for i in range(2)]
    records[1]["reward"] = float("inf")
    write_jsonl(rollouts / "step_1.jsonl", records)
    with (rollouts / "step_1.jsonl").open("a", encoding="utf-8") as f:
        f.write('{"step": 1, "split": "train", "env_id": 2, "tu')  # a line cut short
    main([str(rollouts), str(tmp_path / "out")])
    assert [(r["id"], r["reward"]) for r in index_rows(tmp_path / "out")] == [(0, records[0]["reward"]), (1, None)]


def test_the_browser_is_written_in_utf8_under_a_c_locale(tmp_path):
    rollouts = tmp_path / "rollouts" / "train"
    reply = "<think>naïve 🙂 ответ 思考</think><answer>{action}</answer>"
    write_jsonl(rollouts / "step_1.jsonl", [play("Bandit", ["phoenix"], reply=reply)])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "LANG", "LC_CTYPE")}
    env |= {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "ragen.trajectory_browser", str(rollouts), str(tmp_path / "out")]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert "naïve 🙂 ответ 思考" in index_rows(tmp_path / "out")[0]["text"]
    assert "ответ" in (tmp_path / "out" / "step_1" / "trajectory_data_0.html").read_text(encoding="utf-8")


def test_states_shown_as_pictures_are_drawn_from_the_record_and_nothing_else_passes(tmp_path):
    """An image env's record keeps the pictures the model saw (PNG data URIs); the page shows those. Anything
    in their place that is not a PNG data URI (an edited or hostile record) is dropped, never written out."""
    from ragen.envs.utils import png_uri

    env = make_env("sokoban", {"image_observation": "alone"})
    obs, info = env.reset(seed=2)
    shown = png_uri(info["images"][0])
    obs_after, _, _, _, info_after = env.step("Up")
    record = play("SimpleSokoban", ["Up"])
    record["turns"][0] |= {"state": obs, "images": [shown, 'data:image/png;base64,iVBORw0KGgo" onerror="alert(1)',
                                                     "javascript:alert(2)"]}
    record |= {"final_state": obs_after, "final_images": [png_uri(info_after["images"][0])]}
    page = write_step([record], tmp_path, 1, -1, CUSTOM_ENVS)[0]
    assert images(page) == [shown, record["final_images"][0]]
    assert png_size(shown) == (96, 96) and "onerror" not in page.read_text() and "javascript:" not in page.read_text()
