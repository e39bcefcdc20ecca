"""The documentation: README.md stays a short tour, docs/ builds as a site with `mkdocs build --strict`, every
page is in mkdocs.yml's nav, and the README's relative links reach files (and headings) that exist."""

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
