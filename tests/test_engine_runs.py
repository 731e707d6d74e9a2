"""iris.device.nvshmem's run analysis (what a put or get toward another node moves as one block-wide call),
against a model in Python, on the CPU backend: the engine itself runs only on GPUs with NVSHMEM, but which
lanes form a run, and where each run starts, is arithmetic the interpreter runs as the GPUs do."""

import pytest
import torch
import triton
import triton.language as tl

import iris  # noqa: F401  (picks the backend: Triton's interpreter on the CPU)
from iris.device import nvshmem as engine

pytestmark = pytest.mark.skipif(not iris.runtime.interpreted(), reason="the model is checked in the interpreter")

ROWS, COLS, SIZE = 4, 8, 4  # a 4 x 8 tile of 4-byte elements
HEAP, SCRATCH = 1 << 20, (1 << 20) + 4096  # this rank's heap base and scratch word (addresses, not memory)
WORLD, CUR = 2, 0


@triton.jit
def _analyse(remote_ptr, local_ptr, ranks_ptr, lanes_ptr, heap_bases, out_rows, out_block, ROWS: tl.constexpr,
             COLS: tl.constexpr):
    cells = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    remote = tl.load(remote_ptr + cells).to(tl.pointer_type(tl.float32))
    local = tl.load(local_ptr + cells).to(tl.pointer_type(tl.float32))
    ranks = tl.load(ranks_ptr + cells)
    lanes = tl.load(lanes_ptr + cells) != 0
    ok, far, near, nbytes, pe = engine._run(remote, local, ranks, 0, heap_bases, lanes)
    tl.store(out_block + tl.arange(0, 1), tl.zeros([1], tl.int64) + ok.to(tl.int64))
    tl.store(out_block + 1 + tl.arange(0, 1), tl.zeros([1], tl.int64) + far)
    tl.store(out_block + 2 + tl.arange(0, 1), tl.zeros([1], tl.int64) + near)
    tl.store(out_block + 3 + tl.arange(0, 1), tl.zeros([1], tl.int64) + nbytes)
    tl.store(out_block + 4 + tl.arange(0, 1), tl.zeros([1], tl.int64) + pe)
    ok, far, near, nbytes, pe = engine._row_runs(remote, local, ranks, 0, heap_bases, lanes)
    rows = tl.arange(0, ROWS)
    tl.store(out_rows + rows * 3, far)
    tl.store(out_rows + rows * 3 + 1, near)
    tl.store(out_rows + rows * 3 + 2, nbytes)
    tl.store(out_block + 5 + tl.arange(0, 1), tl.zeros([1], tl.int64) + ok.to(tl.int64))
    tl.store(out_block + 6 + tl.arange(0, 1), tl.zeros([1], tl.int64) + pe)


def _model(remote, local, ranks, lanes, groups):
    """(ok, pe, [(far start, near start, bytes) of each group with lanes, else None]) for groups of cells."""
    runs, fine = [], True
    for cells in groups:
        chosen = [c for c in cells if lanes[c]]
        if not chosen:
            runs.append(None)
            continue
        positions = [cells.index(c) for c in chosen]
        consecutive = positions == list(range(positions[0], positions[0] + len(positions)))
        steps = all(remote[b] - remote[a] == SIZE and local[b] - local[a] == SIZE for a, b in zip(chosen, chosen[1:]))
        near, nbytes = local[chosen[0]], SIZE * len(chosen)
        fine &= consecutive and steps and HEAP <= near and near + nbytes <= SCRATCH
        runs.append((remote[chosen[0]], near, nbytes))
    selected = [r for r, on in zip(ranks, lanes) if on]
    ok = fine and bool(selected) and len(set(selected)) == 1
    return ok, (selected[0] if selected else None), runs


def _case(seed):
    """A tile of remote and local addresses, ranks and lanes: rows of a wider matrix or whole rows, masked
    columns or rows, sometimes a hole, a stray rank, a lane outside the heap."""
    g = torch.Generator().manual_seed(seed)
    pick = lambda n: int(torch.randint(n, (1,), generator=g))  # noqa: E731
    stride = COLS if pick(2) else COLS + 1 + pick(5)
    local_stride = COLS if pick(2) else stride
    remote_base, local_base = (8 << 20) + 64 * pick(100), HEAP + 64 * pick(100)
    remote = [remote_base + SIZE * (r * stride + c) for r in range(ROWS) for c in range(COLS)]
    local = [local_base + SIZE * (r * local_stride + c) for r in range(ROWS) for c in range(COLS)]
    rows_on, cols_on = 1 + pick(ROWS), 1 + pick(COLS)
    start_col = pick(COLS - cols_on + 1) if pick(2) else 0
    lanes = [r < rows_on and start_col <= c < start_col + cols_on for r in range(ROWS) for c in range(COLS)]
    ranks = [1] * (ROWS * COLS)
    twist = pick(6)
    if twist == 0:  # a hole
        lanes[pick(ROWS * COLS)] = False
    elif twist == 1:  # one lane toward another rank
        ranks[pick(ROWS * COLS)] = 2
    elif twist == 2:  # the local side outside this rank's heap
        local = [a - (HEAP + 64) for a in local]
    elif twist == 3:  # no lane at all
        lanes = [False] * (ROWS * COLS)
    return remote, local, ranks, lanes


@pytest.mark.parametrize("seed", range(96))
def test_run_analysis_matches_the_model(seed):
    remote, local, ranks, lanes = _case(seed)
    context = torch.zeros(64, dtype=torch.int64)
    bases = 8  # heap_bases points here; the world size sits just before it, the scratch word after the bases
    context[bases - engine._WORLD_BEFORE_BASES.value] = WORLD
    context[bases + CUR] = HEAP
    context[bases + WORLD + engine.SCRATCH_AFTER_BASES.value] = SCRATCH
    out_rows = torch.zeros(ROWS * 3, dtype=torch.int64)
    out_block = torch.zeros(7, dtype=torch.int64)
    as_tensor = lambda values: torch.tensor([int(v) for v in values], dtype=torch.int64)  # noqa: E731
    _analyse[(1,)](as_tensor(remote), as_tensor(local), as_tensor(ranks).to(torch.int32), as_tensor(lanes),
                   context[bases:], out_rows, out_block, ROWS=ROWS, COLS=COLS)
    block_ok, block_pe, (block_run,) = _model(remote, local, ranks, lanes, [list(range(ROWS * COLS))])
    assert bool(out_block[0]) == block_ok, (seed, out_block.tolist())
    if block_ok:
        assert tuple(out_block[1:4].tolist()) == block_run and int(out_block[4]) == block_pe
    rows_ok, rows_pe, runs = _model(remote, local, ranks, lanes,
                                    [list(range(r * COLS, (r + 1) * COLS)) for r in range(ROWS)])
    assert bool(out_block[5]) == rows_ok, (seed, out_block.tolist())
    if rows_ok:
        assert int(out_block[6]) == rows_pe
        for r, run in enumerate(runs):
            got = tuple(out_rows[3 * r:3 * r + 3].tolist())
            assert got[2] == (0 if run is None else run[2]), (seed, r, got, run)
            if run is not None:
                assert got == run, (seed, r, got, run)
