"""The documentation: README.md stays a short tour, docs/ builds as a site with `mkdocs build --strict`, every
page is in mkdocs.yml's nav, the README's relative links reach files (and headings) that exist, and the
generated config reference matches the schema."""

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def _nav_pages(nav) -> list[str]:
    """The page files of a mkdocs nav: a list of 'file', {'Title': 'file'} or {'Section': [...]}."""
    pages = []
    for entry in nav:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def _heading_anchors(markdown: str) -> set[str]:
    """The ids mkdocs' toc gives a page's headings (lower case, punctuation dropped, spaces to hyphens)."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    titles = re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", title.lower()).strip().replace(" ", "-") for title in titles}


def test_site_builds_strict(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "index.html").is_file() and (tmp_path / "recipes-and-results" / "index.html").is_file()


def test_readme_is_short():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move depth into docs/"


def test_every_docs_page_is_in_the_nav():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md"))
    assert sorted(set(nav)) == pages, f"not in mkdocs.yml's nav: {set(pages) - set(nav)}; " \
                                     f"in the nav, no such page: {set(nav) - set(pages)}"
    assert len(nav) == len(set(nav)), "a page is listed twice in mkdocs.yml's nav"


def test_readme_relative_links_exist():
    readme = (REPO / "README.md").read_text()
    targets = [t for t in LINK.findall(readme) if not re.match(r"[a-z]+:", t)]  # http:, https:, mailto:
    assert targets, "found no relative links in README.md: has the link pattern stopped matching?"
    broken = []
    for target in targets:
        path, _, anchor = target.partition("#")
        file = REPO / path if path else REPO / "README.md"
        if not file.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and file.suffix == ".md" and anchor not in _heading_anchors(file.read_text()):
            broken.append(f"{target}: no heading #{anchor} in {path or 'README.md'}")
    assert not broken, "README.md's broken links:\n" + "\n".join(broken)


def test_every_figure_has_a_caption_saying_what_it_measured():
    """A figure is read apart from its page: the italic line under it names the model and the seeds (or that
    nothing was validated)."""
    bare = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith("!["):
                caption = next((text for text in lines[i + 1:] if text.strip()), "")
                if not (caption.startswith("*") and "SmolLM2" in caption
                        and ("seed" in caption or "no validation" in caption)):
                    bare.append(f"{page.name}: {line}")
    assert not bare, "figures without a caption naming the model and seeds:\n" + "\n".join(bare)


def test_config_reference_is_current():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "config_reference.py"), "--check"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_config_reference_lists_every_key(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("config_reference", REPO / "scripts" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = module.render()
    for key, help_ in [("trainer.total_training_steps", ""), ("actor_rollout_ref.actor.optim.lr", "AdamW learning rate"),
                       ("es_manager.val.env_groups", ""), ("custom_envs.<name>.env_type", "ENV_REGISTRY"),
                       ("trainer.watchdog.rules.<name>.threshold", "")]:
        assert f"| `{key}` |" in page and help_ in page, key
    # the comment block above a field is its help (lr_scheduler's comment sits on the line before it)
    assert "constant \\| cosine (to min_lr_ratio * lr at the last step)" in page
    assert "| `es_manager.val.env_groups` | <code>int</code> | <code>64</code> |" in page  # the val factory's default, not the class's
    # a stale page fails --check
    monkeypatch.setattr(module, "PAGE", tmp_path / "config-reference.md")
    (tmp_path / "config-reference.md").write_text(page.replace("AdamW learning rate", "learning rate"))
    monkeypatch.setattr(sys, "argv", ["config_reference.py", "--check"])
    assert module.main() == 1


def _results_table_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("results_table", REPO / "scripts" / "results_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_tables_are_the_published_results():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "results_table.py"), "--check"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_results_json_becomes_its_rows(tmp_path, monkeypatch):
    """What reproduce.py writes is what the table shows; a recipe without a reproduction says so; an edited
    number in a table is stale."""
    module = _results_table_module()
    summary = {"recipe": "bandit", "model": "/root/.cache/ragen/SmolLM2-135M-Instruct", "machine": "2 CPU cores",
               "commit": "abc1234", "date": "2026-11-26", "seeds": [1, 2, 3], "val_seed": 83000000,
               "val_groups": 64, "steps": {"1": 20, "2": 20, "3": 20},
               "val_success": {"Bandit": {"before": [0.578] * 3, "after": [1.0, 1.0, 0.9375], "after_mean": 0.979,
                                          "after_std": 0.036, "before_mean": 0.578}},
               "baselines": {"Bandit": {"random": 0.469, "constant": None, "oracle": 1.0}}}
    (tmp_path / "bandit").mkdir()
    (tmp_path / "bandit" / "results.json").write_text(json.dumps(summary))
    text = module.table(module.load_results(tmp_path), "#results")
    assert ("| Bandit | 57.8 % → **97.9 %** ± 3.6 (100.0 %, 100.0 %, 93.8 %) | 46.9 % | — | 100.0 % | 100 % | "
            "`bandit`: 3 seeds, 20 steps, 64 states from seed 83000000; SmolLM2-135M-Instruct, 2 CPU cores, "
            "2026-11-26 ([details](#results)) |") in text
    assert "| `countdown` | no published reproduction yet" in text and "| `bandit` | no published" not in text
    (tmp_path / "sokoban_warm_start").mkdir()
    warm = summary | {"recipe": "sokoban", "warm_start": True, "warm_start_args": ["--train-size=8000"],
                      "steps": {"1": 1, "2": 1, "3": 1}}
    (tmp_path / "sokoban_warm_start" / "results.json").write_text(json.dumps(warm))
    text = module.table(module.load_results(tmp_path), "#results")
    assert "`sokoban_warm_start`: 3 seeds, warm start (--train-size=8000) + RL, 1 step, 64 states" in text
    (tmp_path / "sokoban_warm_start" / "results.json").write_text(json.dumps(warm | {"seeds": [1], "steps": {"1": 20}}))
    text = module.table(module.load_results(tmp_path), "#results")
    assert "`sokoban_warm_start`: 1 seed, warm start (--train-size=8000) + RL, 20 steps, 64 states" in text
    assert "| `sokoban` | no published" not in text
    stopped = warm | {"steps": {"1": 0, "2": 0, "3": 0}, "interrupted": [1, 2, 3]}  # RL cut before a validation
    (tmp_path / "sokoban_warm_start" / "results.json").write_text(json.dumps(stopped))
    text = module.table(module.load_results(tmp_path), "#results")
    assert ("warm start (--train-size=8000) + RL, no RL step validated (runs of seeds 1, 2, 3 stopped early)"
            in text)
    tested = warm | {"seeds": [1, 2], "test": {  # reproduce.py --test-seed: the row is on the kept-aside levels
        "test_seed": 115000000, "test_groups": 128, "seeds": [1, 2],
        "baselines": {"Bandit": {"random": 0.0625, "constant": ["Up", 0.0], "oracle": 1.0}},
        "success": {"Bandit": {"before": [0.797, 0.789], "after": [0.8125, 0.766], "after_mean": 0.789,
                               "after_std": 0.033}}}}
    (tmp_path / "sokoban_warm_start" / "results.json").write_text(json.dumps(tested))
    text = module.table(module.load_results(tmp_path), "#results")
    assert ("| Bandit | 79.3 % ± 0.6 (79.7 %, 78.9 %) → **78.9 %** ± 3.3 (81.2 %, 76.6 %) | 6.2 % | 0.0 % (Up) | "
            "100.0 % |" in text
            and "`sokoban_warm_start`: 2 seeds, warm start (--train-size=8000) + RL, 1 step, 128 test states from "
                "seed 115000000 (kept aside);" in text)
    (tmp_path / "sokoban_warm_start" / "results.json").unlink()
    text = module.table(module.load_results(tmp_path), "#results")

    page = tmp_path / "page.md"
    page.write_text(f"intro\n{module.BEGIN}\n{text}\n{module.END}\nrest\n")
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "RESULTS", tmp_path)
    monkeypatch.setattr(module, "DETAILS", {"page.md": "#results"})
    module.main(["--check"])  # current: no exit
    page.write_text(page.read_text().replace("97.9 %", "99.0 %"))
    with pytest.raises(SystemExit, match="stale results table in page.md"):
        module.main(["--check"])
    module.main([])
    assert "97.9 %" in page.read_text() and page.read_text().endswith("rest\n")


def test_an_ablation_line_is_the_number_its_results_json_holds(tmp_path):
    module = _results_table_module()
    run = {"machine": "2 CPU cores", "val_seed": 111000000, "val_groups": 64,
           "val_success": {"CoordSokoban": {"before": [0.9, 0.8], "after": [0.95, 0.85]}},
           "test": {"test_seed": 113000000, "test_groups": 128,
                    "success": {"CoordSokoban": {"before": [0.75, 0.8], "after": [0.875, 0.9]}}}}
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "results.json").write_text(json.dumps(run))
    spec = {"lines": [{"observation": "grid_coord", "RL": "GiGPO", "results": "rl", "model": "after", "levels": "test",
                       "tag": "CoordSokoban"},
                      {"observation": "grid", "results": "rl", "model": "before", "levels": "val", "tag": "CoordSokoban"}]}
    header, rule, test_line, val_line = module.ablation_table(spec, tmp_path).splitlines()
    assert header.startswith("| observation | warm start | RL | filter | curriculum | other | levels |")
    assert test_line == ("| grid_coord | — | GiGPO | — | — | — | 128 from 113,000,000 | **88.8 %** ± 1.8 (87.5 %, 90.0 %) | "
                         "`public/rl/`, after; 2 CPU cores |")
    assert val_line.startswith("| grid | — | — | — | — | — | 64 from 111,000,000 | **85.0 %** ± 7.1 (90.0 %, 80.0 %) |")
    for wrong in ({"levels": "tests"}, {"model": "final"}, {"Filter": "top_p"}):  # refused, not shown as "—" or val
        with pytest.raises(SystemExit, match="ablation line"):
            module.ablation_table({"lines": [spec["lines"][0] | wrong]}, tmp_path)
    del run["test"]
    (tmp_path / "rl" / "results.json").write_text(json.dumps(run))
    with pytest.raises(SystemExit, match="has no test"):
        module.ablation_table(spec, tmp_path)


def test_an_ablation_line_of_episode_files_is_their_success_per_seed(tmp_path):
    module = _results_table_module()
    (tmp_path / "lab").mkdir()

    def episodes(name, successes, first=119000000):
        with gzip.open(tmp_path / "lab" / name, "wt", encoding="utf-8") as file:
            for i, success in enumerate(successes):
                file.write(json.dumps({"seed": first + i, "success": success}) + "\n")
        return f"lab/{name}"

    line = {"observation": "grid_coord", "other": "columns", "machine": "2 CPU cores",
            "episodes": [episodes("seed_1.jsonl.gz", [True, True, False, True]),
                         episodes("seed_2.jsonl.gz", [True, False, False, True])]}
    _, _, row = module.ablation_table({"lines": [line]}, tmp_path).splitlines()
    assert row == ("| grid_coord | — | — | — | — | columns | 4 from 119,000,000 | **62.5 %** ± 17.7 (75.0 %, 50.0 %) | "
                   "`public/lab/seed_1.jsonl.gz`, `public/lab/seed_2.jsonl.gz`; 2 CPU cores |")
    other_levels = line | {"episodes": [line["episodes"][0], episodes("seed_3.jsonl.gz", [True] * 4, first=113000000)]}
    for wrong in (other_levels, {k: v for k, v in line.items() if k != "machine"}, line | {"model": "after"}):
        with pytest.raises(SystemExit, match="ablation line"):
            module.ablation_table({"lines": [wrong]}, tmp_path)


DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TOP_KEYS = ("actor_rollout_ref", "trainer", "es_manager", "agent_proxy", "algorithm", "critic", "lora", "logging",
            "ray", "custom_envs", "model_path", "data", "eval", "optim", "model", "env", "training", "system", "hydra",
            "algo", "scale")
# a config key, or an override `key=value`, inside a code span or block: `trainer.save_freq`, `+a.b=1`
CONFIG_KEY = re.compile(r"(?<![\w./-])[+~]{0,2}((?:%s)(?:\.[A-Za-z0-9_<>*@-]+)*)(=?)" % "|".join(TOP_KEYS))
PYTHON_NAMES = {"ray.init", "ray.cluster_utils.Cluster", "agent_proxy.py"}  # code, not config keys


def _code(markdown: str) -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", markdown, flags=re.S) + re.findall(r"`([^`\n]+)`", markdown)


def test_every_config_key_the_docs_name_is_one():
    """Every dotted key and every `key=value` in README.md and docs/ is a key of the training schema, of the
    SFT trainer's, one of RAGEN's old keys the old-key table translates, a config group or Hydra's own."""
    from ragen.overrides import is_group_or_hydra, is_old_key, is_schema_key, schema_paths
    from ragen.sft.trainer import SFTConfig

    sft = [path.split(".") for path in schema_paths(SFTConfig)]

    def known(key: str) -> bool:
        key = re.sub(r"<[^>]*>", "name", key).removesuffix(".*")  # custom_envs.<tag>: any name; logging.*: all
        parts = key.split(".")
        return (is_schema_key(key) or is_old_key(key) or is_group_or_hydra(key)
                or any(len(p) == len(parts) and all(a in ("*", b) for a, b in zip(p, parts)) for p in sft))

    unknown, seen = [], 0
    for page in DOCS:
        if page.name == "config-reference.md":  # generated from the schema itself
            continue
        for code in _code(page.read_text()):
            for match in CONFIG_KEY.finditer(code):
                key, assigned = match.group(1).rstrip(".->"), match.group(2)
                if ("." not in key and not assigned) or key in PYTHON_NAMES:
                    continue
                seen += 1
                if not known(key):
                    unknown.append(f"{page.relative_to(REPO)}: {key}")
    assert seen > 200, f"found only {seen} config keys in the docs: has the pattern stopped matching?"
    assert not unknown, "keys the config does not know:\n" + "\n".join(sorted(set(unknown)))


def test_every_command_the_docs_name_exists():
    """Every `python -m <module>` imports, and every scripts/… and sft/… script named exists."""
    import importlib.util

    missing, modules, scripts = [], set(), set()
    for page in DOCS:
        text = page.read_text()
        modules |= set(re.findall(r"python3? -m ([\w.]+)", text))
        scripts |= set(re.findall(r"(?<![\w/.-])((?:scripts|sft)/[\w/.-]+\.(?:py|sh))", text))
        scripts |= {name for name in re.findall(r"bash ([\w/.-]+\.sh)", text)}
    missing += [f"python -m {m}" for m in sorted(modules) if importlib.util.find_spec(m) is None]
    missing += [path for path in sorted(scripts) if not (REPO / path.removeprefix("./")).is_file()]
    assert len(modules) > 5 and len(scripts) > 10, (modules, scripts)
    assert not missing, "named in the docs, but not in the repository: " + ", ".join(missing)


def test_every_script_answers_help():
    """Each command-line script prints its usage for --help and exits 0 (the shell scripts print the comment
    at their top instead of acting on `--help` as an argument). The scripts run a few at a time: most of each
    run is Python importing its libraries."""
    from concurrent.futures import ThreadPoolExecutor

    def python_script(script: Path) -> str | None:
        done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                              cwd=REPO)
        if done.returncode != 0 or (script.name != "flops.py" and "usage" not in done.stdout.lower()
                                    and "downloads nothing" not in done.stdout):
            return f"{script.name}: exit {done.returncode}, {done.stdout[:80]!r} {done.stderr[-200:]!r}"
        return None

    def shell_script(script: Path) -> str | None:
        done = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=120, cwd=REPO)
        if done.returncode != 0 or not done.stdout.strip():
            return f"{script.name}: exit {done.returncode}, {done.stderr[-200:]!r}"
        return None

    shell = [REPO / "train.sh", *sorted((REPO / "scripts").glob("*.sh")), *sorted((REPO / "sft").glob("*.sh"))]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = [*pool.map(python_script, sorted((REPO / "scripts").glob("*.py"))), *pool.map(shell_script, shell)]
    failed = [result for result in results if result]
    assert not failed, "\n".join(failed)
