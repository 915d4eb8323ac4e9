"""`exactspec bench`: speculative decoding against plain decoding and transformers' assisted generation.

Modules: `prompts` (the built-in prompt set), `runner` (the whole run),
`runs` (one timed generation, ours or transformers'), `costs` (c and v(k)
measured directly), `timing` (forward hooks, round timestamps, steady state),
`theory` (the speedup model of docs/algorithm.md "Measured quantities"),
`records` (the typed records of what a run measured, as bench.json holds them),
`summary` (raw measurements to one row per setting), `report` (Markdown,
JSON, plots). The command line is `exactspec.cli.bench`.
"""
