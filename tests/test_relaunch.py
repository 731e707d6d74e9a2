"""iris.host.replay.relaunch: a kernel launched with new arguments on every call gives what Triton's own launch gives,
and its key tells apart everything Triton specializes on (on the CPU backend a call is Triton's own launch)."""

import torch
import triton
import triton.language as tl

import iris  # noqa: F401  (the CPU backend: Triton's interpreter where there is no GPU)
from iris.host.replay.relaunch import Relaunch, _key_of


@triton.jit
def _scaled_copy(src, dst, n, scale, step, BLOCK: tl.constexpr):
    """dst[i * step] = src[i * step] * scale for i * step < n (step 1: a specialization Triton makes)."""
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)) * step
    mask = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask) * scale, mask=mask)


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def test_new_arguments_on_every_call_give_triton_launchs_result():
    launch = Relaunch(_scaled_copy, BLOCK=64)
    for dtype in (torch.float32, torch.float16):  # (bfloat16 arithmetic: beyond Triton 3.8's interpreter)
        base = torch.arange(1000, device=_device()).to(dtype)
        for offset, n, scale, step in ((0, 1000, 2.0, 1), (1, 999, 3.0, 1), (0, 16, 0.5, 2), (3, 997, -1.0, 16),
                                       (0, 1000, 2.0, 1)):  # aligned and not, n 16 or not, step 1, 2, 16; again
            src = base[offset:]
            got = torch.full_like(src, -7)
            want = got.clone()
            launch((triton.cdiv(n, 64),), src, got, n, scale, step)
            _scaled_copy[(triton.cdiv(n, 64),)](src, want, n, scale, step, BLOCK=64)
            assert torch.equal(got, want), (dtype, offset, n, scale, step)


def test_the_key_holds_what_triton_specializes_on():
    x = torch.zeros(64, dtype=torch.float32)
    assert _key_of(x) != _key_of(x[1:])  # 16-byte aligned or not
    assert _key_of(x) == _key_of(x[4:])  # both aligned
    assert _key_of(x) != _key_of(x.view(torch.int32))  # another dtype
    assert len({_key_of(1), _key_of(2), _key_of(16), _key_of(1 << 40), _key_of(1 << 63)}) == 5  # 1, 16, widths
    assert _key_of(3) == _key_of(5) and _key_of(32) == _key_of(48)
    assert _key_of(True) != _key_of(1) and _key_of(2.0) != _key_of(2)
