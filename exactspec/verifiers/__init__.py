"""Verifiers: pure functions that turn a draft block and the target's p into the tokens a round emits."""
