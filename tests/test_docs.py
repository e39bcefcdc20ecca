"""The documentation: README.md stays a short tour, docs/ builds as a site with `mkdocs build --strict`, every
page is in mkdocs.yml's nav, the README's relative links reach files (and headings) that exist, and the
generated config reference matches the schema."""

import re
import subprocess
import sys
from pathlib import Path

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
