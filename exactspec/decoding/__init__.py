"""The decoding layer: rounds (`engine`), continuous batching (`scheduler`), gamma policies (`gamma`),
and the one place that wires them from a strategy (`strategy`).

It sits above the drafters, verifiers and models, and below every entry point (API, server,
bench, audit, checking, CLI).
"""
