"""Pure statistics that both the sweep (lit/sweep: when to stop spending seeds) and the comparison (lit/compare: what
the report says) stand on: tests of paired differences, alpha spending, group-sequential levels and decisions.
Numbers in, numbers out; nothing here imports MLflow, Lightning, the sweep or compare."""
