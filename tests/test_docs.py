"""The documentation site builds in strict mode, generates the plugin reference, and fails on a broken link.

Skipped where MkDocs is not installed (it is the ``docs`` extra: ``pip install -e ".[docs]"``); CI installs it
and also runs ``mkdocs build --strict`` itself.
"""

from __future__ import annotations

import pytest
import yaml

from arch_plugins import registry
from tests.conftest import REPO

pytest.importorskip("mkdocs", reason="MkDocs is the docs extra: pip install -e '.[docs]'")
pytest.importorskip("material", reason="the Material theme is the docs extra: pip install -e '.[docs]'")

from mkdocs.commands.build import build  # noqa: E402
from mkdocs.config import load_config  # noqa: E402
from mkdocs.exceptions import Abort  # noqa: E402


def _build(config_file, site_dir) -> None:
    build(load_config(config_file=str(config_file), strict=True, site_dir=str(site_dir)))


def test_site_builds_strict_with_a_generated_page_per_plugin_kind(tmp_path):
    _build(REPO / "mkdocs.yml", tmp_path / "site")
    for kind in registry.kinds():
        page = (tmp_path / "site" / "plugins" / kind / "index.html").read_text()
        for name in registry.names(kind):
            assert f'id="{name}"' in page, f"{kind} page lacks {name}"
    catalogue = (tmp_path / "site" / "plugins" / "catalogue" / "index.html").read_text()
    assert "rmsnorm" in catalogue and "python cli.py plugins NAME" not in catalogue  # the generated page won
    home = (tmp_path / "site" / "index.html").read_text()
    assert "pip install -e" in home  # the README is the home page


def test_a_broken_link_fails_the_build(tmp_path):
    """The site's own validation settings, on a one-page site whose page links to a page that does not exist."""
    settings = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the missing page](missing.md).\n")
    config = {"site_name": "t", "docs_dir": str(docs), "validation": settings["validation"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    with pytest.raises(Abort):
        _build(tmp_path / "mkdocs.yml", tmp_path / "site")
