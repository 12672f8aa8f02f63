"""MkDocs hook: the plugin reference and the site's home page, generated at build time.

The plugin pages are written from the registry (``arch_plugins.registry`` and ``arch_plugins.catalogue``), one
page per kind, so a new kind or a new plugin appears without anyone copying a docstring into a Markdown file.
The home page is the repository's README with its links rewritten for the site, so the front door exists once.
"""

from __future__ import annotations

import html
import inspect
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the checkout being documented, not whichever arch-lab is installed
    sys.path.insert(0, str(ROOT))

from arch_plugins import catalogue, registry  # noqa: E402

ARXIV = re.compile(r"\b(?:arXiv[: ]*)?(\d{4}\.\d{4,5})\b")
# Markdown links and images whose target is a path inside the repository (not a URL, not an anchor).
LINK = re.compile(r"(!?)\[([^\]]*)\]\((?!https?://|#|mailto:)([^)\s]+)\)")


def on_config(config):
    """Every kind's page goes into the nav's "Plugins" section, after the pages mkdocs.yml names there."""
    for section in config["nav"] or ():
        if isinstance(section, dict) and "Plugins" in section:
            entries = section["Plugins"]
            named = {p for entry in entries for p in (entry.values() if isinstance(entry, dict) else [entry])}
            at = next((i + 1 for i, entry in enumerate(entries)
                       if isinstance(entry, dict) and "plugins/catalogue.md" in entry.values()), 0)
            for kind in reversed(registry.kinds()):
                if f"plugins/{kind}.md" not in named:
                    entries.insert(at, {f"{kind} plugins": f"plugins/{kind}.md"})
    return config


def on_files(files: Files, config) -> Files:
    for kind in registry.kinds():
        files.append(File.generated(config, f"plugins/{kind}.md", content=kind_page(kind)))
    files.append(File.generated(config, "plugins/interfaces.md", content=interfaces_page()))
    # The committed catalogue.md only tells a reader of the repository how to get this page; the site gets the page.
    for generated, content in (("plugins/catalogue.md", catalogue_page()), ("index.md", home_page())):
        existing = files.get_file_from_path(generated)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, generated, content=content))
    return files


def catalogue_page() -> str:
    lines = ["# Plugin catalogue", "",
             "Every plugin installed where this site was built, by kind, as `python cli.py plugins` lists it. "
             "Generated from the registry at build time; a plugin you install appears after the next build.", "",
             "| kind | name | package | description |", "|---|---|---|---|"]
    for row in catalogue.rows():
        lines.append(f"| [{row['kind']}]({row['kind']}.md) | [`{row['name']}`]({row['kind']}.md#{anchor(row['name'])}) "
                     f"| {row['package']} {row['version']} | {cell(row['description'])} |")
    return "\n".join(lines) + "\n"


def selected_in_architecture(kind: str) -> bool:
    """Whether the architecture config has a field for this kind (``arch.norm``); other kinds are chosen elsewhere."""
    import dataclasses

    from lit.models.transformer import TransformerConfig

    return kind in {f.name for f in dataclasses.fields(TransformerConfig)}


def kind_page(kind: str) -> str:
    names = registry.names(kind)
    how = (f"Select one with `arch.{kind}: NAME` in a recipe or `--model.arch.{kind}=NAME`; set its options with "
           f"`arch.{kind}_options` (`--model.arch.{kind}_options.OPTION=VALUE`). "
           if selected_in_architecture(kind) else "")
    lines = [f"# {kind} plugins", "",
             f"{how}Entry-point group `{registry.GROUP_PREFIX}{kind}`. This page is generated from the registry "
             "at build time.", ""]
    if not names:
        lines.append("No plugin of this kind is installed.")
    for name in names:
        lines += plugin_section(kind, name)
    return "\n".join(lines) + "\n"


def plugin_section(kind: str, name: str) -> list[str]:
    out = [f"## `{name}` {{ #{anchor(name)} }}", ""]
    try:
        d = catalogue.details(kind, name)
    except registry.PluginError as exc:  # listed but not importable: say so instead of failing the whole site
        return out + [f"Cannot be loaded here: {exc}", ""]
    s = d.spec
    cls = registry.load(kind, name)
    out += [f"**Package** {s.package} {s.version} · **class** `{s.target}`", ""]
    source = paper(cls)
    if source:
        out += [f"**Paper** {source}", ""]
    out += ["```text", d.doc or "(no docstring)", "```", ""]
    if d.options is None:
        out.append("**Options:** any keyword (it takes `**kwargs`).")
    elif not d.options:
        out.append("**Options:** none.")
    else:
        out += ["| option | type | default |", "|---|---|---|"]
        out += [f"| `{o.name}` | {code(o.type)} | {code(o.default)} |" for o in d.options]
    out.append("")
    used = recipes_using(kind, name)
    out.append("**Recipes:** " + (", ".join(f"`{r}`" for r in used) if used else "none."))
    out.append("")
    return out


def interfaces_page() -> str:
    """What a plugin implements: every class of ``arch_plugins.interfaces`` with its methods, from the code."""
    from arch_plugins import interfaces

    lines = ["# Plugin interfaces", "",
             "Generated from `arch_plugins/interfaces.py` at build time: the base classes a plugin subclasses and the "
             "objects the stack hands it. How they fit together: [writing a plugin](writing.md).", ""]
    classes = [c for _, c in inspect.getmembers(interfaces, inspect.isclass) if c.__module__ == interfaces.__name__]
    for cls in sorted(classes, key=lambda c: inspect.getsourcelines(c)[1]):
        lines += [f"## `{cls.__name__}`", "", "```text", inspect.getdoc(cls) or "(no docstring)", "```", ""]
        for name, member in cls.__dict__.items():
            if name.startswith("_") or not callable(member) and not isinstance(member, property):
                continue
            func = member.fget if isinstance(member, property) else member
            doc = inspect.getdoc(func)
            lines += [f"### `{cls.__name__}.{name}` {{ #{cls.__name__.lower()}-{name} }}", "",
                      "```python", f"def {name}{str(inspect.signature(func)).replace(chr(39), '')}", "```", ""]
            lines += [doc, ""] if doc else []
    return "\n".join(lines) + "\n"


def paper(cls) -> str:
    """The paper as the plugin's module names it: the module docstring's first line, plus any arXiv id in it."""
    module = sys.modules.get(cls.__module__)
    doc = inspect.getdoc(module) if module is not None else None
    if not doc:
        return ""
    first = doc.strip().splitlines()[0]
    ids = sorted(set(ARXIV.findall(doc)))
    links = " ".join(f"[arXiv:{i}](https://arxiv.org/abs/{i})" for i in ids)
    return f"{cell(first)} {links}".strip()


def recipes_using(kind: str, name: str) -> list[str]:
    """Recipes that select ``name`` for ``kind`` (a ``kind: name`` line in the YAML)."""
    line = re.compile(rf"^\s*{re.escape(kind)}:\s*['\"]?{re.escape(name)}['\"]?\s*(#.*)?$", re.MULTILINE)
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "recipes").rglob("*.yaml") if line.search(p.read_text()))


def home_page() -> str:
    """The README, its links rewritten: ``docs/x.md`` becomes ``x.md``; other repository paths become code spans
    (the site holds only docs/, and a link out of it would be a broken link)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")

    def rewrite(m: re.Match) -> str:
        bang, label, target = m.groups()
        if target.startswith("docs/"):
            return f"{bang}[{label}]({target[len('docs/'):]})"
        return label if label.startswith("`") else f"`{label}`" if label == target else f"{label} (`{target}`)"

    return LINK.sub(rewrite, text)


def anchor(name: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "-", name.lower())


def code(text: str) -> str:
    """Inline code that survives a table cell: a backtick span would show an escaped pipe as ``\\|``."""
    return "<code>" + html.escape(str(text)).replace("|", "&#124;") + "</code>"


def cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")

