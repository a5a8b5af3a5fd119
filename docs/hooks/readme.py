"""Hooks of the documentation site (mkdocs.yml).

* The home page is README.md: the same text on GitHub and on the site, its ``docs/`` links made relative to the
  site's root. A README link outside docs/ would have no page on the site, so it fails the build.
* The API pages read the sources as the installed package lays them out: ``babelfeed`` is the folder loader/,
  ``babelfeed.adapters`` the folder adapters/. mkdocstrings reads files, not the import system, so a tree of
  links with that layout is made under build/apisrc for it.
"""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _source_tree() -> None:
    tree = os.path.join(ROOT, "build", "apisrc", "babelfeed")
    os.makedirs(tree, exist_ok=True)
    links = {name: os.path.join(ROOT, "loader", name) for name in os.listdir(os.path.join(ROOT, "loader"))
             if name.endswith(".py") or os.path.isfile(os.path.join(ROOT, "loader", name, "__init__.py"))}
    links.update({name: os.path.join(ROOT, name) for name in ("adapters", "configs", "examples")})
    for name in os.listdir(tree):
        if name not in links:
            os.unlink(os.path.join(tree, name))
    for name, target in links.items():
        link = os.path.join(tree, name)
        if os.path.islink(link) and os.readlink(link) == target:
            continue
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(target, link)


_source_tree()  # when mkdocs loads this hook: before mkdocstrings looks for its paths


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != "index.md":
        return markdown
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()

    def relink(m):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            return m.group(0)
        if not target.startswith("docs/"):
            raise ValueError(f"README.md links to {target}, which is not in docs/: the site has no page for it")
        return f"]({target[len('docs/'):]})"

    return LINK.sub(relink, text)

