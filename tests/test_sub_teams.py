"""Sub-teams: two disjoint teams of a 4-rank job (a tuple or list of ranks, or a torch ProcessGroup) run
collectives at the same time, round after round with fresh data, each team's result against torch; the whole
job's collectives interleave with theirs (the slow tier: 4 ranks)."""

import pytest
import torch
import torch.distributed as dist

import iris
from iris.testing import RankPool

pytestmark = pytest.mark.slow

N, ROUNDS = 64, 3


@pytest.fixture(scope="module")
def four_ranks():
    pool = RankPool(4)
    yield pool
    pool.close()


def _team_rounds(kind):
    ctx = iris.iris(4 << 20)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    halves = ((0, 1), (2, 3))
    groups = {"process group": lambda: [dist.new_group(list(half)) for half in halves],
              "list": lambda: [list(half) for half in halves], "ranks": lambda: list(halves)}[kind]()
    mine = halves[rank // 2]
    team = groups[rank // 2]
    size = len(mine)
    x, out = ctx.zeros(N), ctx.zeros(N)
    gathered, scattered = ctx.zeros(size * N), ctx.zeros(N // size)
    whole = ctx.zeros(N)
    wrong = []
    for round_ in range(ROUNDS):
        inputs = {r: torch.arange(N, dtype=torch.float32) * (r + 1) + 10 * round_ for r in range(world)}
        x.copy_(inputs[rank].to(device))
        ctx.barrier()  # every rank's input in place: the halves then run at once, each on its own team
        ctx.ccl.all_reduce(out, x, group=team)
        ctx.ccl.all_gather(gathered, x, group=team)
        ctx.ccl.reduce_scatter(scattered, x, group=team)
        ctx.device_barrier(team)
        total = sum(inputs[r] for r in mine)
        index = mine.index(rank)
        if not torch.equal(out.cpu(), total):
            wrong.append(("all_reduce", round_))
        if not torch.equal(gathered.cpu(), torch.cat([inputs[r] for r in mine])):
            wrong.append(("all_gather", round_))
        if not torch.equal(scattered.cpu(), total[index * (N // size):(index + 1) * (N // size)]):
            wrong.append(("reduce_scatter", round_))
        ctx.ccl.all_reduce(whole, x)  # the whole job, between the teams' rounds
        ctx.device_barrier()
        if not torch.equal(whole.cpu(), sum(inputs.values())):
            wrong.append(("world all_reduce", round_))
        ctx.barrier()
    plans = len(ctx.ccl._plans)
    ctx.close()
    return wrong, plans


@pytest.mark.parametrize("kind", ["ranks", "list", "process group"])
def test_two_disjoint_teams_run_collectives_at_once_and_the_world_between(four_ranks, kind):
    # every kind of team is planned: the four calls of a round are replayed from then on (a list as well)
    assert four_ranks.run(_team_rounds, kind) == [([], 4)] * 4
