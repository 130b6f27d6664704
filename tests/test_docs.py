"""The documentation's promises that need no mkdocs: every public name of eqsat has an entry in the API reference,
every page is in the site's navigation, and the README is short and its links lead to files that exist.
(`./eqsat.sh docs` builds the site itself with warnings as errors, in CI.)"""

import importlib
import re
from pathlib import Path

import eqsat

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# where pyproject's package-dir installs the pipeline's folders: the API reference names them as in the repository
INSTALLED_AS = {"extract.": "eqsat.extract.", "backends.": "eqsat.backends.", "rules.": "eqsat.rules."}


def documented_objects() -> list[tuple[str, object]]:
    """Each `::: module.name` directive of the docs pages, with the object it names."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        for path in re.findall(r"^::: *([\w.]+)\s*$", page.read_text(), flags=re.MULTILINE):
            module, _, name = path.rpartition(".")
            for prefix, installed in INSTALLED_AS.items():
                if module.startswith(prefix):
                    module = installed + module.removeprefix(prefix)
            found.append((path, getattr(importlib.import_module(module), name)))
    return found


def test_every_public_name_is_in_the_api_reference():
    documented = [obj for _, obj in documented_objects()]
    missing = [name for name in eqsat.__all__ if not any(obj is getattr(eqsat, name) for obj in documented)]
    assert not missing, f"public names of eqsat without a `::: module.name` entry in docs/api.md: {missing}"


def test_documented_names_resolve():
    paths = [path for path, _ in documented_objects()]
    assert len(paths) >= len(eqsat.__all__)
    assert len(set(paths)) == len(paths), "a name is documented twice"


def test_every_page_is_in_the_navigation():
    config = (ROOT / "mkdocs.yml").read_text()
    pages = [page.relative_to(DOCS).as_posix() for page in DOCS.rglob("*.md")]
    assert pages
    assert not [page for page in pages if f": {page}" not in config], "docs pages missing from mkdocs.yml's nav"


def test_readme_is_short_and_its_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", readme) if not re.match(r"\w+://", t)]
    assert any(t.startswith("docs/") for t in targets)
    assert not [t for t in targets if not (ROOT / t).exists()], "README links to files that do not exist"
