"""The README is a front page and the rest is the docs site: the README stays short with both commands on its first
screen, every relative link in it and in docs/ reaches a file (and a heading, where it names one), and mkdocs.yml's
nav lists every page. The strict site build itself (links, anchors, the API reference) runs in scripts/test.sh."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README = REPO / "README.md"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _without_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _without_code(text: str) -> str:
    """The text outside fenced code blocks and code spans (a `[x](y)` in code is no link)."""
    return re.sub(r"`[^`\n]*`", "", _without_fences(text))


def _slug(heading: str) -> str:
    """Python-Markdown's toc slug (what MkDocs anchors headings with)."""
    text = unicodedata.normalize("NFKD", heading.replace("`", "")).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    headings = re.finditer(r"^#{1,6} (.+)$", _without_fences(page.read_text()), flags=re.M)
    return {_slug(m.group(1)) for m in headings}


def _broken_links(source: Path) -> list[str]:
    broken = []
    for match in LINK.finditer(_without_code(source.read_text())):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (http:, mailto:) or a heading of the same page
        path, _, anchor = target.partition("#")
        resolved = (source.parent / path).resolve()
        if not resolved.exists():
            broken.append(f"{source.relative_to(REPO)}: {target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{source.relative_to(REPO)}: {target} (no such heading)")
    return broken


def _nav_files(entries: list) -> list[str]:
    files = []
    for entry in entries:
        if isinstance(entry, str):
            files.append(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                files += _nav_files(value) if isinstance(value, list) else [value]
    return files


def test_the_readme_is_a_front_page_with_both_commands_on_its_first_screen() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the rest belongs on a docs/ page"
    first_screen = "\n".join(lines[:60])
    assert "pip install torch==2.13.0 -c requirements/constraints.txt -e ." in first_screen, "the install command"
    assert "playground app" in first_screen, "the command that runs the app"
    assert "bash scripts/test.sh" in first_screen, "the test command"
    assert "](docs/images/app.png)" in README.read_text(), "one picture of the app"


def test_every_relative_link_reaches_a_file_and_heading() -> None:
    assert _pages(), "docs/ has no pages"
    broken = [problem for source in (README, *_pages()) for problem in _broken_links(source)]
    assert broken == []


def test_the_readme_links_to_the_site_by_reader() -> None:
    links = {m.group(1) for m in LINK.finditer(README.read_text()) if m.group(1)}
    for page in (
        "docs/booth/index.md",
        "docs/guide/blueprints.md",
        "docs/ci/e2e.md",
        "docs/contributing/architecture.md",
    ):
        assert page in links, f"README.md does not link {page}"


def test_the_nav_lists_every_page_and_only_pages_that_exist() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    listed = _nav_files(config["nav"])
    pages = [str(page.relative_to(DOCS)) for page in _pages()]
    assert sorted(set(pages) - set(listed)) == [], "pages missing from mkdocs.yml's nav"
    assert sorted(set(listed) - set(pages)) == [], "nav entries without a page"
    assert len(listed) == len(set(listed)), "a page listed twice"


def test_the_site_builds_offline() -> None:
    """No web fonts and no plugin that fetches at build time, so the strict build in the test command needs no
    network; the build also fails on a broken anchor, not just on a missing page."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config["theme"]["font"] is False
    assert config["strict"] is True
    assert config["validation"]["links"]["anchors"] == "warn"  # a warning fails a --strict build
    plugins = [next(iter(p)) if isinstance(p, dict) else p for p in config["plugins"]]
    assert set(plugins) <= {"search", "mkdocstrings"}, plugins
    build = next(line for line in (REPO / "scripts" / "test.sh").read_text().splitlines() if "mkdocs build" in line)
    assert "--strict" in build
    assert "--quiet" not in build and " -q" not in build, "--quiet hides the warnings --strict counts: it never fails"
