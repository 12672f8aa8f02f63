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


def test_site_builds_strict_with_generated_plugin_pages(tmp_path, monkeypatch):
    """One build, strict: a page per registered kind with a section per plugin, the interfaces, the README as
    home. Kinds are read from the registry, never listed by hand, so a kind added here gets its page and nav entry."""
    monkeypatch.setattr(registry, "KINDS", (*registry.KINDS, "future_kind"))
    monkeypatch.setitem(registry._LOCAL, "future_kind", {})
    _build(REPO / "mkdocs.yml", tmp_path / "site")
    site = tmp_path / "site"
    for kind in registry.kinds():
        page = (site / "plugins" / kind / "index.html").read_text()
        assert f"{registry.GROUP_PREFIX}{kind}" in page
        for name in registry.names(kind):
            assert f'id="{name}"' in page, f"{kind} page lacks {name}"
    assert "arch.norm_options" in (site / "plugins" / "norm" / "index.html").read_text()
    assert "arch.future_kind" not in (site / "plugins" / "future_kind" / "index.html").read_text()
    assert 'href="../future_kind/"' in (site / "plugins" / "norm" / "index.html").read_text()  # in the nav
    catalogue = (site / "plugins" / "catalogue" / "index.html").read_text()
    assert "rmsnorm" in catalogue and "python cli.py plugins NAME" not in catalogue  # the generated page won
    interfaces = (site / "plugins" / "interfaces" / "index.html").read_text()
    assert 'id="normstrategy-site"' in interfaces and 'id="projectiontype-linear"' in interfaces
    assert "pip install -e" in (site / "index.html").read_text()  # the README is the home page


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

