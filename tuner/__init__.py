"""kdispatch.tuner: the autotuning router compiler (offline; `kdispatch` itself never imports it).

    features.py  shape features per definition (variable axes + derived ones), one table
    gate.py      correctness gate with FlashInfer-Bench evaluator semantics, tolerances in one table
    timing.py    CUDA-graph / eager timing with rotated inputs; the worker's job (materialise, gate, time)
    runner.py    planning against the store, worker processes (one per GPU), progress, tune/bench flows
    store.py     the SQLite results store and its committed .jsonl twin; FlashInfer-Bench trace export
    fit.py       region fitting (threshold splits) and held-out regret
    codegen.py   routers/<arch>/<definition>.py
    report.py    Markdown + PNG report
    landing.py   `kdispatch add`: candidate variants with provenance
    cli.py       the `kdispatch` subcommands tune, route, explain, bench, report, add, export-traces

See tuner/README.md.
"""
