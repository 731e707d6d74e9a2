"""Helpers for testing multi-rank code: a persistent pool of rank processes."""

from iris.testing.ranks import RankFailure, RankPool

__all__ = ["RankFailure", "RankPool"]
