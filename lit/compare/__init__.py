"""``cli.py compare``: a seed-replicated, significance-tested report of a sweep, read back from MLflow alone.

runs.py reads a sweep (the ``lit/sweep/protocol.py`` layout) into pandas; stats.py holds the statistics;
analysis.py turns a sweep into the report's numbers; plots.py draws them; report.py writes the Markdown;
command.py parses the command line (``main(argv) -> int``); calibration.py checks the statistics' error rates by
simulation (``python -m lit.compare.calibration``).
"""
