"""The decoding core: sampling settings and transforms, random streams, the engine that runs rounds, metrics.

Modules: `settings` (`SamplingSettings`), `transforms` (logits -> the p and q
sampled from), `sampler` (one random stream per row), `engine` (rounds of
draft, target, verify), `metrics` (what a run counts and times). The verifier
it calls is in `exactspec.verifiers`, the drafters in `exactspec.drafters`,
the models behind the `LanguageModel` protocol in `exactspec.models`.
"""
