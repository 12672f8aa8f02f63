"""`python cli.py plugins [NAME]`: what is installed, and one plugin's kind, origin, docstring and options.

A module of its own, apart from the training CLI, so that listing answers at once: it imports neither
Lightning, MLflow nor torch (``arch_plugins.catalogue`` reads package metadata and source files).
``plugins NAME`` imports that one plugin, and so torch.
"""

from __future__ import annotations

from arch_plugins import catalogue
from lit.errors import OneLineArgumentParser, one_line_errors


@one_line_errors
def main(argv: list[str]) -> int:
    parser = OneLineArgumentParser(prog="cli.py plugins", description="List the installed plugins, or show one.")
    parser.add_argument("name", nargs="?", help="a plugin's name: show its kind, package, docstring and options")
    args = parser.parse_args(argv)
    print(show(args.name) if args.name else listing())
    return 0


# The arch fields of the stabilisers (lit/models/transformer.py, TransformerConfig), named here rather than read
# from the config class: listing must not import torch.
STABILISERS = (("qk_norm", "QK-norm"), ("logit_softcap", "logit soft-cap"),
               ("clipped_softmax_gamma, clipped_softmax_zeta", "clipped softmax"),
               ("gated_attention, gated_attention_init", "gated attention"))


def listing() -> str:
    rows = catalogue.rows()
    header = dict(kind="KIND", name="NAME", package="PACKAGE", version="VERSION", description="DESCRIPTION")
    widths = {k: max(len(str(r[k])) for r in [header, *rows]) for k in ("kind", "name", "package", "version")}
    lines = ["  ".join(str(r[k]).ljust(widths[k]) for k in widths) + "  " + r["description"] for r in [header, *rows]]
    lines.append("\n`python cli.py plugins NAME` shows one plugin's docstring and options; select it in a recipe "
                 "with arch.<kind>: NAME and arch.<kind>_options: {option: value} (an optimizer: model.optimizer "
                 "and model.optimizer_options).")
    lines.append("Stabilisers on top of any norm strategy are arch fields (arch_plugins/stabilisers): "
                 + "; ".join(f"{field} ({what})" for field, what in STABILISERS) + ".")
    return "\n".join(lines)


def show(name: str) -> str:
    return "\n\n".join(_describe(catalogue.details(spec.kind, spec.name)) for spec in catalogue.find(name))


def _describe(d: catalogue.Details) -> str:
    s = d.spec
    lines = [f"{s.name}  ({s.kind}, {s.origin}, {s.target})", "", d.doc or "(no docstring)", ""]
    if d.options is None:
        lines.append("options: any keyword (it takes **kwargs)")
    elif not d.options:
        lines.append("options: none")
    else:
        lines.append(f"options ({_selected_in(s.kind)}_options):")
        width = max(len(o.name) for o in d.options)
        type_width = max(len(o.type) for o in d.options)
        lines += [f"  {o.name.ljust(width)}  {o.type.ljust(type_width)}  default: {o.default}" for o in d.options]
    return "\n".join(lines)


def _selected_in(kind: str) -> str:
    """Where a recipe selects a plugin of ``kind``: the architecture's parts under arch, the optimizer under model."""
    return "model.optimizer" if kind == "optimizer" else f"arch.{kind}"
