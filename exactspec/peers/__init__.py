"""Peers: other systems run the way we run ours, for the benchmark and the audit to compare against."""
