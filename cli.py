"""Entry point: `python cli.py SUBCOMMAND ...`; `python cli.py --help` lists the subcommands (lit/commands.py)."""

from lit.commands import main

if __name__ == "__main__":
    main()
