"""Every fault and misuse scenario of :mod:`iris.testing.faults` at 2 and 4 ranks, as real jobs under ``iris run``:
the job ends with the scenario's exit code and a message naming the fault, well before its time limit, and leaves
nothing in /dev/shm."""

import pytest

from iris.testing import faults


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("scenario", faults.SCENARIOS, ids=[s.name for s in faults.SCENARIOS])
def test_a_fault_ends_every_rank_with_a_message_and_leaves_nothing(scenario, ranks):
    outcome = faults.run(scenario, ranks, timeout=150)
    assert outcome.exit_code == scenario.exit_code, outcome.output[-4000:]
    assert outcome.message, f"no line matches {scenario.message!r}:\n{outcome.output[-4000:]}"
    assert not outcome.leftovers, outcome.leftovers
    assert outcome.seconds < 140, outcome.output[-4000:]  # ended by the fault's handling, not the time limit
