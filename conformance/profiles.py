"""How much each hypothesis profile runs: examples per property and iterations inside a litmus kernel."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    """One profile's budget.

    Args:
        max_examples: hypothesis examples for an ordinary property.
        derandomize: same examples on every run (CI).
        litmus_iterations: messages per channel in one ordering-test launch.
        barrier_rounds: write -> barrier -> read rounds per barrier example (at most).
    """

    max_examples: int
    derandomize: bool
    litmus_iterations: int
    barrier_rounds: int

    def __post_init__(self):
        for name in ("max_examples", "litmus_iterations", "barrier_rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"Profile.{name}={getattr(self, name)} must be at least 1")

    def examples(self, weight: float) -> int:
        """Examples for a property that costs ``weight`` times an ordinary one (at least 1)."""
        return max(1, round(self.max_examples * weight))


PROFILES = {
    # the default tier's: every property once or twice, derandomized (the README's test command)
    "smoke": Profile(max_examples=2, derandomize=True, litmus_iterations=4, barrier_rounds=2),
    "ci": Profile(max_examples=10, derandomize=True, litmus_iterations=16, barrier_rounds=4),
    "dev": Profile(max_examples=40, derandomize=False, litmus_iterations=64, barrier_rounds=8),
    "thorough": Profile(max_examples=60, derandomize=False, litmus_iterations=4000, barrier_rounds=32),
}


#: the profile when neither --hypothesis-profile nor IRIS_CONFORMANCE_PROFILE names one
DEFAULT = "smoke"


def current() -> Profile:
    """The profile of this session (set by conformance/conftest.py for the driver and the ranks)."""
    name = os.environ.get("IRIS_CONFORMANCE_PROFILE", DEFAULT)
    if name not in PROFILES:
        raise ValueError(f"IRIS_CONFORMANCE_PROFILE={name!r} is not one of {', '.join(PROFILES)}")
    return PROFILES[name]
