"""benchmarks/timing.py: the one interleaved timing loop the throughput benchmarks share."""

from __future__ import annotations

import itertools

from benchmarks.timing import interleave, timed


def test_interleave_warms_each_once_then_rotates_who_goes_first():
    calls, n = [], itertools.count()
    results = interleave(["a", "b", "c"], lambda name: calls.append(name) or next(n), rounds=4,
                         warmup=lambda name: calls.append(f"warm {name}"),
                         after_round=lambda r, latest: calls.append((r, latest)))
    assert calls[:3] == ["warm a", "warm b", "warm c"]
    assert [c for c in calls[3:] if isinstance(c, str)] == list("abc" "bca" "cab" "abc")  # round r starts at r mod n
    # Measurements in call order 0..11, kept per contender in round order.
    assert results == {"a": [0, 5, 7, 9], "b": [1, 3, 8, 10], "c": [2, 4, 6, 11]}
    assert calls[6] == (0, {"a": 0, "b": 1, "c": 2}) and calls[-1] == (3, {"a": 9, "b": 10, "c": 11})


def test_two_contenders_alternate():
    order = []
    interleave(["adamw", "muon"], order.append, rounds=3)
    assert order == ["adamw", "muon", "muon", "adamw", "adamw", "muon"]


def test_timed_counts_n_steps_on_its_clock_inside_the_syncs():
    ticks, events = itertools.count(), []
    elapsed = timed(lambda: events.append("step"), 3, clock=lambda: events.append("clock") or next(ticks),
                    sync=lambda: events.append("sync"))
    assert events == ["sync", "clock", "step", "step", "step", "sync", "clock"] and elapsed == 1


def test_the_benchmarks_time_with_the_shared_loop():
    from benchmarks import ngpt_throughput, optimizer_overhead, throughput, timing

    for module in (throughput, ngpt_throughput, optimizer_overhead):
        assert module.timed is timing.timed and module.interleave is timing.interleave, module.__name__


def test_run_rounds_fills_each_contenders_rates_per_round(capsys):
    import torch

    from benchmarks.timing import Contender, report, run_rounds, training_step

    x = torch.randn(4, 8)
    contenders = [Contender(name, model, training_step(model, lambda m: m(x).square().mean()))
                  for name, model in (("small", torch.nn.Linear(8, 8)), ("large", torch.nn.Linear(8, 64)))]
    run_rounds(contenders, items_per_step=4, steps=2, rounds=3, warmup=1, unit="rows/s")
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["round 1/3", "round 2/3", "round 3/3"]
    assert all(len(c.rates) == 3 and min(c.rates) > 0 for c in contenders)
    assert set(report(contenders, "rows/s")) == {"small/large"}
