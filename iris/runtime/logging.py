"""Rank-aware logging: every line reads ``[Iris] [rank/world] message``; the level from IRIS_LOG_LEVEL.

The ``iris`` logger is set up on first use, not at import.
"""

from __future__ import annotations

import logging
import sys

from iris import config

DEBUG, INFO, WARNING, ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR

logger = logging.getLogger("iris")


class IrisFormatter(logging.Formatter):
    """``[Iris] [rank/world] message``, or ``[Iris] message`` for a record without a rank."""

    def format(self, record):
        rank = getattr(record, "iris_rank", None)
        world = getattr(record, "iris_num_ranks", None)
        if rank is None or world is None:
            return f"[Iris] {record.getMessage()}"
        return f"[Iris] [{rank}/{world}] {record.getMessage()}"


_RankFormatter = IrisFormatter


def _level_from_env() -> int:
    name = config.log_level_name()
    level = logging.getLevelName(name)
    if not isinstance(level, int):
        raise ValueError(f"IRIS_LOG_LEVEL={name!r} is not a level; use DEBUG, INFO, WARNING or ERROR")
    return level


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time of the call (so redirection works)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


_configured = False


def _configure() -> None:
    """Give the ``iris`` logger its rank-tagged stderr handler and IRIS_LOG_LEVEL's level (once)."""
    global _configured
    if _configured:
        return
    _configured = True
    if not logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(_RankFormatter())
        logger.addHandler(handler)
        logger.propagate = False
    if logger.level == logging.NOTSET:  # a level the application set itself is kept
        logger.setLevel(_level_from_env())


def set_logger_level(level) -> None:
    """Set the level of Iris's logger.

    Args:
        level: ``iris.DEBUG``, ``iris.INFO``, ``iris.WARNING``, ``iris.ERROR`` or a level name.

    Example:
        >>> import iris
        >>> iris.set_logger_level(iris.DEBUG)
    """
    if isinstance(level, str):
        resolved = logging.getLevelName(level.upper())
        if not isinstance(resolved, int):
            raise ValueError(f"unknown log level {level!r}; use DEBUG, INFO, WARNING or ERROR")
        level = resolved
    _configure()
    logger.setLevel(level)


def log(level: int, message: str, rank, num_ranks) -> None:
    """Emit ``message`` at ``level`` tagged with the rank and world size."""
    _configure()
    if logger.isEnabledFor(level):
        logger.log(level, message, extra={"iris_rank": rank, "iris_num_ranks": num_ranks})
