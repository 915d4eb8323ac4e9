"""`exactspec bench`: speculative decoding against plain decoding and transformers' assisted generation.

Modules: `prompts` (the built-in prompt set), `methods` (method names, sampling rows),
`config` (what to run), `runner` (the whole run), `runs` (one timed generation, ours or a
peer's), `costs` (c and v(k) measured directly), `timing` (forward hooks, round timestamps,
steady state), `theory` (the speedup model of docs/algorithm.md "Measured quantities"),
`records` (the typed records of what a run measured), `result` (the whole run's record, as
bench.json holds it), `summary` (raw measurements to one row per setting; its records in
`summary_records`, with `comparisons` and `estimates`), `report` (bench.json, report.md and
plots written and read back; the Markdown in `markdown`, `tables`, `comparison_tables` and
`formatting`, the plots in `plots`). The command line is `exactspec.cli.bench`.
"""
