"""iris.host.replay.direct: a launch's parameter block packed once from the kernel's parameter layout.

The packing is plain bytes and runs here; the launch itself (cuLaunchKernel of a compiled kernel) runs on a GPU in
tests/test_cuda_graphs.py and its C path in tests/test_native_replay.py.
"""

import struct

import pytest

from iris.host.replay.direct import pack_value, packed

PLAIN = {"num_ctas": 1, "num_warps": 4, "shared": 0, "global_scratch_size": 0, "profile_scratch_size": 0,
         "launch_cooperative_grid": False, "launch_pdl": False}


def test_each_scalar_and_pointer_is_packed_little_endian_at_its_width():
    assert pack_value("*bf16", 0x7F00_0000_1000, 8) == (0x7F00_0000_1000).to_bytes(8, "little")
    assert pack_value("i32", -2, 4) == (-2).to_bytes(4, "little", signed=True)
    assert pack_value("i64", 1 << 40, 8) == (1 << 40).to_bytes(8, "little")
    assert pack_value("u64", (1 << 64) - 1, 8) == b"\xff" * 8
    assert pack_value("i1", True, 1) == b"\x01"
    assert pack_value("fp32", 1e-6, 4) == struct.pack("<f", 1e-6)
    assert pack_value("fp64", 0.1, 8) == struct.pack("<d", 0.1)


@pytest.mark.parametrize("kind, value, size", [("i32", 7, 8), ("*fp32", 16, 4), ("fp32", 1.0, 8), ("fp16", 1.0, 2),
                                               ("i32", 1 << 40, 4), ("nvTmaDesc", 0, 128)])
def test_a_value_that_does_not_fit_its_parameter_is_not_packed(kind, value, size):
    assert pack_value(kind, value, size) is None


def test_the_block_holds_the_arguments_at_their_offsets_and_null_scratch_pointers_after():
    block = packed(["*fp32", "constexpr", "i32", "fp32", "constexpr"], [0x1000, 256, -1, 0.5, True],
                   [(0, 8), (8, 4), (12, 4), (16, 8), (24, 8)], PLAIN)
    assert block == (0x1000).to_bytes(8, "little") + b"\xff" * 4 + struct.pack("<f", 0.5) + bytes(16)


@pytest.mark.parametrize("change", [{"num_ctas": 2}, {"launch_cooperative_grid": True}, {"launch_pdl": True},
                                    {"global_scratch_size": 64}, {"profile_scratch_size": 8}])
def test_a_launch_that_is_not_plain_keeps_its_graph(change):
    assert packed(["*fp32"], [0x1000], [(0, 8), (8, 8)], {**PLAIN, **change}) is None


def test_a_layout_that_does_not_match_the_signature_is_refused():
    assert packed(["*fp32", "i32"], [0x1000, 3], [(0, 8)], PLAIN) is None  # fewer parameters than arguments
    assert packed(["*fp32"], [0x1000], [(0, 8), (8, 4)], PLAIN) is None  # a trailing parameter is no pointer
    assert packed(["*fp32", "i32"], [0x1000, 3], [(0, 8), (8, 8)], PLAIN) is None  # i32 in an 8-byte slot
