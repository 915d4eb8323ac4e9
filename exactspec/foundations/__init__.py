"""The foundations every other folder builds on; they import nothing of exactspec above them.

Modules: `settings` (`SamplingSettings`), `transforms` (logits -> the p and q sampled from),
`sampler` (one random stream per row), `rows` (the row lifecycle every stateful role
implements), `trees` (trees of candidate tokens: the shape of a tree proposal), `costs`
(`CostModel`: c and v(k)), `metrics` (what a run counts and times), `errors` (`InvalidArgument`),
`records` (`JsonRecord`: frozen dataclasses to JSON and back), `provenance` (`Provenance`: the
commit, command, machine and time of a result).
"""
