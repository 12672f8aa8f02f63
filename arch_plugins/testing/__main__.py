"""`python -m arch_plugins.testing KIND NAME` (or `--all`): the conformance table; exit 1 when a check fails."""

from __future__ import annotations

import argparse
import json
import sys

from arch_plugins import registry
from arch_plugins.testing import CHECKS, FAST_CHECKS, Result, check
from arch_plugins.testing.stacks import stacks


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        self.exit(2, f"error: {message} (`python -m arch_plugins.testing --help` shows the usage)\n")


def table(results: list[Result]) -> str:
    header = ("KIND", "NAME", "CHECK", "RESULT", "SECONDS", "DETAIL")
    rows = [header] + [(r.kind, r.name, r.check, r.status.upper(), f"{r.seconds:.2f}", r.detail) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = []
    for row in rows:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row[:5], widths, strict=True)) + "  " + row[5])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m arch_plugins.testing",
                     description="Check that plugins behave like the built-ins (the conformance kit).")
    parser.add_argument("kind", nargs="?", help=f"the plugin's kind: {', '.join(registry.kinds())}")
    parser.add_argument("name", nargs="?", help="the plugin's registered name")
    parser.add_argument("--all", action="store_true", help="every registered plugin of every kind")
    parser.add_argument("--slow", action="store_true", help="add the slow checks (torch.compile)")
    parser.add_argument("--check", action="append", choices=list(CHECKS), help="only this check (repeatable)")
    parser.add_argument("--options", default="{}", help='the plugin\'s options as JSON, e.g. \'{"eps": 1e-5}\'')
    args = parser.parse_args(argv)
    if args.all == bool(args.kind):
        parser.error("name a plugin (KIND NAME) or pass --all")
    try:
        options = json.loads(args.options)
        if not isinstance(options, dict):
            raise ValueError("not an object")
        if args.all:
            targets = [(kind, name) for kind in registry.kinds() for name in registry.names(kind)]
        else:
            if not args.name:
                parser.error("name the plugin after its kind: KIND NAME")
            registry.spec(args.kind, args.name)  # an unknown kind or name is one line, with the closest match
            targets = [(args.kind, args.name)]
        builders = stacks()
    except (registry.PluginError, ValueError, LookupError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    checks = args.check or (list(CHECKS) if args.slow else list(FAST_CHECKS))
    results = []
    for kind, name in targets:
        results += check(kind, name, checks=checks, options=options if not args.all else None, stacks=builders)
    print(table(results))
    failed = [r for r in results if r.status == "fail"]
    print(f"\n{len(results) - len(failed)} of {len(results)} checks passed or do not apply; {len(failed)} failed.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
