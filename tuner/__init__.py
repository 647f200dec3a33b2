"""kdispatch.tuner: the autotuning router compiler (offline; `kdispatch` itself never imports it).

    features.py  shape features (variable axes + the spec's derived ones)
    gate.py      correctness gate with FlashInfer-Bench evaluator semantics (the spec's checks)
    timing.py    CUDA-graph / eager timing with rotated inputs (the spec's rotation)
    job.py       the worker's job: materialise, gate, time, per workload
    plan.py      the environment key; what the store lacks, cut into jobs
    pool.py      worker processes (one per GPU), progress, recovery from crashes and hangs
    flows.py     the tune / route / bench flows
    stats.py     percentiles, geomeans, the one noise margin
    store.py     the SQLite results store and its committed FlashInfer-Bench trace twin
    fit.py       region fitting (threshold splits) and held-out regret
    codegen.py   routers/<arch>/<definition>.py
    report.py    Markdown + PNG report
    landing.py   `kdispatch add`: candidate variants with provenance
    cli.py       the `kdispatch` subcommands tune, route, explain, bench, report, add

See tuner/README.md.

Nothing here is specific to a definition: every such fact lives in the definition's spec
(kdispatch/definitions/<op_type>/spec.py, kdispatch/spec.py).
"""
