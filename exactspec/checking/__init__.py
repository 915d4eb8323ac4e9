"""Checking exactness: toy models, exact enumeration of the real engine, statistical tests, the `verify` grid.

Modules: `toy` (tabular toy models, any function of the history), `exact`
(the engine's exact output distribution by enumeration, and TV distance),
`statistical` (bucketed G-test of samples against exact target
probabilities), `grid` (the cases `exactspec verify` runs). The command line
is `exactspec.cli.verify`.
"""
