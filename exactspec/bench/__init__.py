"""`exactspec bench`: speculative decoding against plain decoding and Hugging Face assisted generation.

Modules: `prompts` (the built-in prompt set), `runner` (the measurements),
`theory` (the speedup model of SPEC.md "Measured quantities"), `summary`
(raw measurements to one row per setting), `report` (Markdown, JSON, plots),
`command` (the CLI).
"""
