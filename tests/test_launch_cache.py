"""iris.replay.LaunchCache: a kernel launched again with the same arguments replays its bound launch; the key
tells apart every argument the compiled kernel depends on. On the CPU backend every launch goes through
Triton's interpreter (the results are checked); on GPUs tests/test_moe.py runs its kernels through it."""

import torch
import triton
import triton.language as tl

from iris.replay import LaunchCache, launch_key


@triton.jit
def _scale(x, out, n, factor, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) * factor, mask=mask)


def test_the_key_tells_apart_what_the_compiled_kernel_depends_on():
    x = torch.arange(8, dtype=torch.float32)
    same = launch_key((1,), (x, 8, 2.0), {"BLOCK": 8})
    assert same == launch_key((1,), (x, 8, 2.0), {"BLOCK": 8})
    assert same != launch_key((1,), (x.view(torch.int32), 8, 2.0), {"BLOCK": 8})  # same address, other dtype
    assert same != launch_key((1,), (x[1:], 8, 2.0), {"BLOCK": 8})                 # another address
    assert same != launch_key((1,), (x, 9, 2.0), {"BLOCK": 8})
    assert same != launch_key((2,), (x, 8, 2.0), {"BLOCK": 8})
    assert same != launch_key((1,), (x, 8, 2.0), {"BLOCK": 16})
    assert launch_key((1,), (torch.nn.Parameter(x), 8), {}) is None  # not a plain tensor: never remembered


def test_repeated_and_changed_launches_give_the_kernels_results():
    cache = LaunchCache(_scale, limit=2)
    x = torch.arange(8, dtype=torch.float32)
    for factor in (2.0, 2.0, 2.0, 3.0, 2.0):
        out = torch.zeros(8)
        cache((1,), x, out, 8, factor, BLOCK=8)
        assert torch.equal(out, x * factor)
