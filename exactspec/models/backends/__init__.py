"""Backends: what computes the forward passes of a pair, one file each, found by `registry.backends()`."""
