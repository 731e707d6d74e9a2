"""Helpers for testing multi-rank code: a persistent pool of rank processes, refusal messages."""

from iris.testing.ranks import RankFailure, RankPool
from iris.testing.refusals import refusals

__all__ = ["RankFailure", "RankPool", "refusals"]
