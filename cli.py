"""Entry point: `python cli.py {fit,validate,test,predict,plugins} --config recipes/<recipe>.yaml`."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["plugins"]:
        # Listing needs package metadata only: answered before Lightning, MLflow or torch are imported.
        from lit.plugins_command import main as plugins

        sys.exit(plugins(sys.argv[2:]))
    from lit.cli import main

    main()
