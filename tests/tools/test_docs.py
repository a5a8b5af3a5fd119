"""The documentation: no dead link in README.md or docs/, the generated reference pages up to date with their
sources, and the site building with mkdocs with every warning an error (what `make docs` runs)."""

import os
import re
import subprocess
import sys
import unicodedata

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(REPO, "docs")
PAGES = [os.path.join(REPO, "README.md")] + sorted(
    os.path.join(d, f) for d, _, files in os.walk(DOCS) for f in files if f.endswith(".md"))
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans, where a link is a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "``", text)


def slug(heading: str) -> str:
    """The anchor mkdocs (Python-Markdown's toc) gives a heading; GitHub's agrees on these headings."""
    text = re.sub(r"[`*_]|\{#[^}]*\}", "", heading).strip()
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: str) -> set:
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"^```.*?^```", "", f.read(), flags=re.S | re.M)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.M)}


def links(path: str) -> list:
    with open(path, encoding="utf-8") as f:
        return [m.group(1) for m in LINK.finditer(_prose(f.read()))]


def test_the_link_checker_sees_links_and_anchors():
    assert slug("Many corpora: the gather engine") == "many-corpora-the-gather-engine"
    assert slug("`babelfeed binarize`") == "babelfeed-binarize"
    assert links(os.path.join(REPO, "README.md")), "README.md links to the docs"
    assert len(PAGES) >= 20


@pytest.mark.parametrize("page", PAGES, ids=[os.path.relpath(p, REPO) for p in PAGES])
def test_no_dead_links(page):
    where = os.path.relpath(page, REPO)
    dead = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):
            assert target.startswith("https://"), f"{where}: {target}: links out of the docs are https"
            continue  # not fetched: the tests run offline
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(full):
            dead.append(f"{target} (no {os.path.relpath(full, REPO)})")
            continue
        if page != PAGES[0] and not full.startswith(DOCS + os.sep):
            dead.append(f"{target} (outside docs/: the site has no page for it)")
        if anchor and full.endswith(".md") and anchor not in anchors(full):
            dead.append(f"{target} (no heading #{anchor} in {os.path.relpath(full, REPO)})")
    assert not dead, f"{where} has dead links:\n  " + "\n  ".join(dead)


def test_every_docs_page_is_in_the_site_nav():
    with open(os.path.join(REPO, "mkdocs.yml"), encoding="utf-8") as f:
        nav = set(re.findall(r":\s*(\S+\.md)\s*$", f.read(), flags=re.M))
    pages = {os.path.relpath(p, DOCS) for p in PAGES[1:]}
    assert pages - nav == set(), "pages no reader can reach from the nav"
    assert nav - pages == set(), "nav entries without a page"


def test_the_cli_reference_is_written_from_the_parser():
    from babelfeed.tools.cli import reference_markdown

    with open(os.path.join(DOCS, "reference", "cli.md"), encoding="utf-8") as f:
        assert f.read() == reference_markdown(), "docs/reference/cli.md is stale: run make docs"
    assert "## `babelfeed binarize`" in reference_markdown() and "--config.KEY VALUE" in reference_markdown()


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is in the test extra: make test has it")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir",
                          str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert out.returncode == 0, out.stderr[-4000:]
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "BatchLoader" in api and "state_dict" in api, "the API page holds the docstrings"
    roles = re.findall(r":(?:func|class|mod|meth|attr):\S{0,40}", api)
    assert not roles, f"Sphinx roles left as text on the API page: {roles[:5]}"
    assert "<blockquote>" not in api and "doctest:" not in api, "doctest examples are code blocks, not quotes"
    keys = (tmp_path / "site" / "reference" / "config" / "index.html").read_text()
    assert "&lt;/s&gt; included" in keys, "</s> in a key's text shows as text, not as an HTML tag"
    home = (tmp_path / "site" / "index.html").read_text()
    assert "Your own data in five minutes" in home, "the home page is README.md"
