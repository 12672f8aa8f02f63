"""What is installed, described for people: a list read without importing anything, and one plugin in full.

``rows()`` answers ``cli.py plugins`` from package metadata and the plugins' source files: the one-line
description is the first line of the class docstring, read with ``ast``, so listing imports no plugin and
no torch (importing torch alone takes seconds on a small machine). A plugin whose module cannot be found
is marked broken; one whose source cannot be read (a compiled or generated class) is listed without a
description.

``details(name)`` answers ``cli.py plugins NAME``: it imports that one plugin (the only reliable way to
see inherited options and defaults) and returns its kind, package, version, full docstring and options.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import inspect
from dataclasses import dataclass
from pathlib import Path

from arch_plugins import registry
from arch_plugins.registry import PluginError, PluginSpec

BROKEN = "BROKEN: its module is not installed (`python cli.py plugins NAME` says more)"
CONFLICT = "CONFLICT: also claimed by "


def rows() -> list[dict[str, str]]:
    """kind, name, package, version, description of every installed plugin, sorted by kind then name."""
    out = []
    for kind in registry.kinds():
        for name, claims in sorted(registry._specs(kind).items()):
            for s in claims:
                if len(claims) > 1:
                    description = CONFLICT + ", ".join(c.origin for c in claims if c is not s)
                else:
                    description = summary(s)
                out.append(dict(kind=kind, name=name, package=s.package, version=s.version,
                                description=description))
    return out


def summary(spec: PluginSpec) -> str:
    """The first line of the plugin's docstring, read from its source file; '' when there is none to read."""
    if ":" not in spec.target:  # an in-process registration: its object is at hand
        local = registry._LOCAL[spec.kind].get(spec.name)
        doc = inspect.getdoc(local[1]) if local else None
        return _first_line(doc)
    module, _, attr = spec.target.partition(":")
    source = module_source(module.strip())
    if source is None:
        return BROKEN
    if source == "":
        return ""
    return _first_line(docstring_in_source(source, attr.strip()))


def module_source(module: str) -> str | None:
    """The source text of ``module`` without importing it or its parent packages.

    None when the module does not exist; '' when it exists but has no readable source (compiled).
    ``importlib.util.find_spec`` of a dotted name would import the parents (and ``arch_plugins``'s
    plugins import torch), so only the top-level package is looked up, the rest is walked on disk.
    """
    top, *rest = module.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not rest:
        path = spec.origin
    else:
        path = None
        for folder in spec.submodule_search_locations or ():
            base = Path(folder, *rest)
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    path = str(candidate)
                    break
            if path:
                break
            if any(base.parent.glob(f"{rest[-1]}.*.so")) or any(base.parent.glob(f"{rest[-1]}.*.pyd")):
                return ""
        if path is None:
            return None
    if not path or not path.endswith(".py"):
        return ""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError:
        return ""


def docstring_in_source(source: str, attr: str) -> str | None:
    """The docstring of the top-level class or function ``attr`` (a dotted path for nested classes)."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return None
    node = None
    for part in attr.split("."):
        node = next((n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return ast.get_docstring(node) if node is not None else None


def _first_line(doc: str | None) -> str:
    return doc.strip().splitlines()[0] if doc and doc.strip() else ""


@dataclass(frozen=True)
class Option:
    name: str
    type: str
    default: str  # "(required)" when there is none


@dataclass(frozen=True)
class Details:
    spec: PluginSpec
    doc: str
    options: list[Option] | None  # None: it takes arbitrary keyword options


def find(name: str) -> list[PluginSpec]:
    """Every installed plugin called ``name``, of any kind; a one-line ``PluginError`` when there is none."""
    found = [registry.spec(kind, name) for kind in registry.kinds() if name in registry._specs(kind)]
    if not found:
        every = sorted({n for kind in registry.kinds() for n in registry._specs(kind)})
        close = difflib.get_close_matches(name, every, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise PluginError(f"no plugin named {name!r}; {hint}`python cli.py plugins` lists them")
    return found


def details(kind: str, name: str) -> Details:
    """Everything a user needs to select plugin ``name`` of ``kind``: imports it (and only it)."""
    cls = registry.load(kind, name)
    options = None
    accepted = registry.option_names(cls)
    if accepted is not None:
        parameters = inspect.signature(cls.__init__).parameters
        options = [Option(p, _type_name(parameters[p].annotation), _default(parameters[p].default))
                   for p in accepted]
    return Details(registry.spec(kind, name), inspect.getdoc(cls) or "", options)


def _type_name(annotation) -> str:
    if annotation is inspect.Parameter.empty:
        return "any"
    if isinstance(annotation, str):  # postponed annotations (from __future__ import annotations)
        return annotation
    return getattr(annotation, "__name__", None) if isinstance(annotation, type) else str(annotation).replace(
        "typing.", "")


def _default(default) -> str:
    return "(required)" if default is inspect.Parameter.empty else repr(default)
