"""Entry point: `python cli.py {fit,validate,test,predict,plugins} --config recipes/<recipe>.yaml`."""

from lit.cli import main

if __name__ == "__main__":
    main()
