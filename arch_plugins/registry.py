"""Name -> plugin, through package entry points: the project's built-ins and third parties alike.

Entry-point group ``arch_plugins.<kind>``; the entry-point name is what users write (``norm: rmsnorm``).
Listing names reads package metadata only; a plugin's code is imported when it is selected, then
checked against its kind's interface. Every failure is a ``PluginError`` whose message is one line
that says what to do.
"""

from __future__ import annotations

import difflib
import inspect
import os
import sys
import warnings
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from arch_plugins.errors import PluginError

GROUP_PREFIX = "arch_plugins."
# The kinds by name, without their interfaces (arch_plugins.interfaces.KIND_INTERFACES, which imports torch):
# listing what is installed reads metadata only and stays fast.
KINDS = ("norm", "residual", "projection", "parametrization", "optimizer")


@dataclass(frozen=True)
class PluginSpec:
    """One registered name, as known from metadata (nothing imported)."""

    kind: str
    name: str
    target: str  # "module:attr", or a repr for in-process registrations
    package: str
    version: str

    @property
    def origin(self) -> str:
        return f"{self.package}=={self.version}"


# Plugins registered in-process (tests, notebooks): kind -> name -> (spec, object).
_LOCAL: dict[str, dict[str, tuple[PluginSpec, Any]]] = {k: {} for k in KINDS}


def kinds() -> list[str]:
    return list(KINDS)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise PluginError(f"unknown plugin kind {kind!r}; kinds are: {', '.join(KINDS)}")


# dist-info folder -> (distribution name, version). Reading a name parses the distribution's whole METADATA file
# (arch-lab's embeds its README), and every stack build asks for six specs; a folder's name carries its version,
# so a folder seen once is known (a reinstall writes a new folder).
_ORIGINS: dict[str, tuple[str, str]] = {}


def _origin(dist: metadata.Distribution | None) -> tuple[str, str]:
    if dist is None:
        return "?", "?"
    folder = str(getattr(dist, "_path", ""))
    if not folder:
        return dist.name, dist.version
    if folder not in _ORIGINS:
        _ORIGINS[folder] = (dist.name, dist.version)
    return _ORIGINS[folder]


# group -> (what the answer depends on, the entry points). Finding entry points reads every installed
# distribution's entry_points.txt; installing or removing one adds or removes a folder on sys.path, which changes
# that folder's modification time, so the answer is read again only then (or when sys.path changes): the test
# importlib.metadata's own directory cache uses.
_ENTRY_POINTS: dict[str, tuple[tuple, metadata.EntryPoints]] = {}


def _path_state() -> tuple:
    def mtime(entry: str) -> int | None:
        try:
            return os.stat(entry or ".").st_mtime_ns
        except OSError:
            return None

    return tuple((entry, mtime(entry)) for entry in sys.path)


def _entry_points(group: str) -> metadata.EntryPoints:
    state = _path_state()
    cached = _ENTRY_POINTS.get(group)
    if cached is None or cached[0] != state:
        cached = _ENTRY_POINTS[group] = (state, metadata.entry_points(group=group))
    return cached[1]


def _specs(kind: str) -> dict[str, list[PluginSpec]]:
    """name -> every distinct package claiming it (more than one is a conflict)."""
    _check_kind(kind)
    found: dict[str, list[PluginSpec]] = {}
    for ep in _entry_points(GROUP_PREFIX + kind):
        spec = PluginSpec(kind, ep.name, ep.value, *_origin(ep.dist))
        claims = found.setdefault(ep.name, [])
        # The same distribution can be seen twice on sys.path (e.g. editable + installed): not a clash.
        if all(c.package != spec.package for c in claims):
            claims.append(spec)
            claims.sort(key=lambda c: c.package)  # deterministic messages, whatever sys.path order
    for name, (spec, _) in _LOCAL[kind].items():
        found[name] = [spec]  # an explicit in-process registration overrides metadata
    return found


def names(kind: str) -> list[str]:
    """Registered names for ``kind``, from metadata only: no plugin code is imported."""
    return sorted(_specs(kind))


def spec(kind: str, name: str) -> PluginSpec:
    specs = _specs(kind)
    if name not in specs:
        available = sorted(specs)
        close = difflib.get_close_matches(name, available, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise PluginError(f"unknown {kind} {name!r}; {hint}available: {', '.join(available) or '(none)'} "
                          f"(`python cli.py plugins` lists them)")
    claims = specs[name]
    if len(claims) > 1:
        who = " and ".join(f"{c.origin} ({c.target})" for c in claims)
        raise PluginError(f"{kind} {name!r} is claimed by two packages: {who}; uninstall one of them")
    return claims[0]


def load(kind: str, name: str) -> type:
    """Import the plugin selected by ``name`` and check it implements its kind's interface."""
    s = spec(kind, name)
    if name in _LOCAL[kind]:
        obj = _LOCAL[kind][name][1]
    else:
        try:
            obj = metadata.EntryPoint(name, s.target, GROUP_PREFIX + kind).load()
        except Exception as exc:  # any import-time failure of third-party code
            raise PluginError(f"{kind} {name!r} from {s.origin} failed to import ({s.target}): "
                              f"{type(exc).__name__}: {exc}") from exc
    from arch_plugins.interfaces import KIND_INTERFACES

    base = KIND_INTERFACES[kind]
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise PluginError(f"{kind} {name!r} from {s.origin} is {obj!r}, not a subclass of "
                          f"{base.__module__}.{base.__name__}; fix the entry point {s.target}")
    return obj


def option_names(cls: type) -> list[str] | None:
    """The options a plugin accepts, or None when it takes arbitrary keyword arguments."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def create(kind: str, name: str, options: dict[str, Any] | None = None) -> Any:
    """Load ``name`` and instantiate it with ``options``, with one-line errors for bad options."""
    cls = load(kind, name)
    options = dict(options or {})
    accepted = option_names(cls)
    if accepted is not None:
        for key in options:
            if key not in accepted:
                close = difflib.get_close_matches(key, accepted, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise PluginError(f"{kind} {name!r} has no option {key!r}; {hint}"
                                  f"its options are: {', '.join(accepted) or '(none)'}")
    try:
        obj = cls(**options)
    except (TypeError, ValueError) as exc:
        raise PluginError(f"{kind} {name!r} rejected its options {options}: {exc}") from exc
    return obj


def register(kind: str, name: str, obj: type, *, package: str = "(in-process)", version: str = "") -> None:
    """Register a plugin without packaging (tests, notebooks). Entry points are the way to ship one."""
    _check_kind(kind)
    if name in _LOCAL[kind] or name in _specs(kind):
        warnings.warn(f"overriding {kind} {name!r} with an in-process registration", stacklevel=2)
    _LOCAL[kind][name] = (PluginSpec(kind, name, repr(obj), package, version), obj)


def unregister(kind: str, name: str) -> None:
    _LOCAL[kind].pop(name, None)
