"""The capability table: its answers, and a demonstration that each of its gaps is real.

Every row of iris.runtime.capabilities.LIMITATIONS has a demonstration here that runs on that backend
and fails if the gap disappears (a newer Triton fixed it): the row is then stale and must go.
"""

import pytest
import torch
import triton
import triton.language as tl

import iris
from iris.runtime.capabilities import LIMITATIONS, limitation
from iris.runtime import SELECTED
from iris.testing.cross_compile import suspended


def test_cpu_gaps_have_reasons_and_gpus_have_none():
    assert "bfloat16" in limitation("cpu", "atomic", torch.bfloat16)
    assert limitation("cpu", "atomic", "float16") is None  # a single writer is exact
    assert "not atomic across processes" in limitation("cpu", "atomic", torch.float16, concurrent=True)
    assert limitation("cpu", "atomic", torch.int32, concurrent=True) is None
    for backend in ("cuda", "hip"):
        assert limitation(backend, "atomic", torch.bfloat16, concurrent=True) is None


def test_every_row_explains_itself():
    for row in LIMITATIONS:
        assert row.backend in ("cpu", "cuda", "hip") and len(row.reason) > 20


# ------------------------------------------------------------------ each gap, shown to be real


@triton.jit
def _atomic_add_kernel(word, value, ROUNDS: tl.constexpr, LANES: tl.constexpr):
    for _ in range(ROUNDS):
        tl.atomic_add(word + tl.zeros([LANES], tl.int32), value, sem="relaxed", scope="sys")


@triton.jit
def _inline_asm_kernel(out):
    lane = tl.inline_asm_elementwise("mov.u32 $0, %laneid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(out, lane)


@triton.jit
def _unguarded_increment_kernel(counter):
    tl.store(counter, tl.load(counter) + 1)  # a plain read-modify-write by every program: a race on a GPU


def _bfloat16_atomics():
    word = torch.zeros(1, dtype=torch.bfloat16)
    with pytest.raises(Exception):  # noqa: B017  (the interpreter's error type varies between releases)
        _atomic_add_kernel[(1,)](word, 1.0, ROUNDS=1, LANES=1)


@triton.jit
def _contended_add_kernel(words, cur, heap_bases, ROUNDS: tl.constexpr, LANES: tl.constexpr, WORDS: tl.constexpr):
    lanes = tl.arange(0, LANES)
    for _ in range(ROUNDS):  # LANES // WORDS lanes on each of rank 0's words, from every rank at once
        iris.atomic_add(words + lanes % WORDS, 1.0, cur, 0, heap_bases, sem="relaxed", scope="sys")


def _float16_adds_lose_updates_on_rank(batches: int) -> int:
    """Batches of float16 adds from every rank into rank 0's words; the adds lost (0 if none)."""
    rounds, lanes, words = 64, 8192, 2048  # each word ends at ranks * 64 * 4 <= 2048: exact in float16
    ctx = iris.iris(1 << 16)
    target = ctx.zeros(words, dtype=torch.float16)
    for _ in range(batches):
        target.zero_()
        ctx.barrier()
        _contended_add_kernel[(1,)](target, ctx.get_rank(), ctx.get_heap_bases(), ROUNDS=rounds, LANES=lanes,
                                    WORDS=words)
        ctx.barrier()
        lost = ctx.get_num_ranks() * rounds * lanes - int(target.double().sum()) if ctx.get_rank() == 0 else 0
        lost = ctx.broadcast(lost, src=0)  # every rank leaves the loop together
        if lost:
            return lost
    return 0


def _float16_concurrent_adds(ranks):
    lost = ranks.run(_float16_adds_lose_updates_on_rank, 30)[0]
    assert lost > 0, "concurrent float16 atomic adds lost nothing in 30 batches: is the row stale?"


def _cuda_graphs():
    with pytest.raises((RuntimeError, AssertionError)):
        torch.cuda.CUDAGraph().capture_begin()


def _inline_asm():
    # the interpreter's own refusal (the cross-compile gate, if on, would refuse first for hip targets)
    with suspended(), pytest.raises(Exception, match="inline_asm not supported"):  # noqa: B017  (type varies)
        _inline_asm_kernel[(1,)](torch.zeros(1, dtype=torch.int32))


def _programs_run_in_order():
    counter = torch.zeros(1, dtype=torch.int32)
    programs = 64
    _unguarded_increment_kernel[(programs,)](counter)
    assert int(counter[0]) == programs  # no update lost: the programs did not overlap


def _no_shmem_on_the_cpu():
    from torch.distributed import _symmetric_memory as symm_mem

    with pytest.raises(RuntimeError, match="does not support device type cpu"):
        symm_mem.empty(16, dtype=torch.uint8, device="cpu")


DEMONSTRATIONS = {
    ("cpu", "atomic", "bfloat16"): _bfloat16_atomics,
    ("cpu", "atomic", "float16"): _float16_concurrent_adds,
    ("cpu", "cuda_graph", None): _cuda_graphs,
    ("cpu", "inline_asm", None): _inline_asm,
    ("cpu", "concurrent_programs", None): _programs_run_in_order,
    ("cpu", "shmem_heap", None): _no_shmem_on_the_cpu,
}


def test_every_row_has_a_demonstration():
    rows = {(row.backend, row.feature, row.dtype) for row in LIMITATIONS}
    assert rows == set(DEMONSTRATIONS), "a row of iris.runtime.capabilities needs a demonstration here (or must go)"


def _rows(concurrent: bool):
    return [pytest.param(row, id=f"{row.backend}-{row.feature}-{row.dtype or 'any'}")
            for row in LIMITATIONS if row.concurrent_only == concurrent]


def _demonstration(row):
    if row.backend != SELECTED:
        pytest.skip(f"a gap of the {row.backend} backend; this run uses {SELECTED}")
    return DEMONSTRATIONS[(row.backend, row.feature, row.dtype)]


@pytest.mark.parametrize("row", _rows(concurrent=False))
def test_the_gap_is_real(row):
    _demonstration(row)()


@pytest.mark.parametrize("row", _rows(concurrent=True))
def test_the_gap_under_contention_is_real(row, ranks):
    _demonstration(row)(ranks)
