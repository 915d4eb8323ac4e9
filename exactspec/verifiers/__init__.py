"""Verifiers: pure functions that turn draft tokens, q, p and a random source into the round's output.

`exactspec.verifiers.token.verify` checks token by token (docs/algorithm.md 2);
`exactspec.verifiers.block.verify_block` decides on the whole block jointly (docs/algorithm.md 5). Both follow
the `exactspec.verifiers.base.Verifier` signature, so the engine takes either.
`exactspec.verifiers.tree.verify_tree` walks a tree of several deterministic candidates (docs/algorithm.md 5,
"Several candidates"); the engine uses it for every proposal that has parents.
"""
