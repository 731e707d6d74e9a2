"""GEMM + communication (iris.ops): each fused op gives every rank its float64 answer, within rounding.

Each case draws an op, M, N, K (any sizes: tiles and programs need not divide them), the output
dtype, a bias or none, communication programs for the reduce ops (FusedConfig.comm_programs) or
else owner-reduce forced on, off or left to the world size (FusedConfig.reduce_at_owner), TMA
operand loads or not (FusedConfig.tma_loads), else K in 2 or 3 parts or not
(FusedConfig.split_k), copies or pushes as the op picks or pushes forced (FusedConfig.copy_engine),
matmul_all_reduce as a pipeline of row chunks or not (FusedConfig.pipeline_chunks; its GEMM leaving the sums
some SMs, FusedConfig.pipeline_comm_sms), all_gather_matmul
multiplied by torch's GEMM where the op's default takes it or Iris's kernel forced (FusedConfig.vendor_gemm),
and the data.
Every rank knows every rank's shards (seeded), so each checks its whole output against the
float64 reference (iris.testing.fused_ops) and sends it back: ranks that must hold the same result
(matmul_all_reduce, all_gather's stacks) hold the same bits. The workspace (and a heap output)
lies in the arena over random bytes, with its counters zeroed, as a fresh one would be.
"""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance import harness
from conformance.profiles import current
from iris.ops import FusedConfig, Workspace
from iris.testing.fused_ops import ON_HEAP, OPS, magnitude, reference, shapes

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
SAME_ON_EVERY_RANK = ("matmul_all_reduce", "matmul_all_gather", "gemm_all_scatter")


def _shards(case, rank: int, a_shape, b_shape):
    g = harness.generator(case["seed"], rank, 21)
    return torch.randn(*a_shape, generator=g).to(torch.bfloat16), torch.randn(*b_shape, generator=g).to(torch.bfloat16)


class _Carver:
    """Consecutive 256-byte aligned regions of the arena."""

    def __init__(self):
        self.offset = 0

    def take(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        tensor = harness.region(self.offset, count, dtype)
        self.offset += -(-count * tensor.element_size() // 256) * 256 + 256
        return tensor


def _fused_op_on_rank(case):
    ctx = harness.context()
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    harness.fill_arena(case["seed"])
    op, dtype = case["op"], case["out_dtype"]
    a_shape, b_shape, out_shape = shapes(op, case["m"], case["n"], case["k"], world)
    carve = _Carver()
    if op in ON_HEAP:
        out = carve.take(out_shape[0] * out_shape[1], dtype).view(out_shape)
        out.fill_(float("nan"))  # poison: every element written
    else:
        out = torch.full(out_shape, float("nan"), dtype=dtype, device=device)
    a, b = (t.to(device) for t in _shards(case, rank, a_shape, b_shape))
    config = FusedConfig(comm_programs=case["comm_programs"], reduce_at_owner=case["reduce_at_owner"],
                         tma_loads=case["tma_loads"], split_k=case["split_k"], copy_engine=case["copy_engine"],
                         pipeline_chunks=case["pipeline_chunks"], vendor_gemm=case["vendor_gemm"],
                         pipeline_comm_sms=case["pipeline_comm_sms"])
    key, spec = ctx.ops.workspace_layout(op, out, a, b, config)
    tensors = {}
    for name, buf in spec.items():
        tensors[name] = carve.take(max(buf.numel, 1), buf.dtype) if buf.heap else \
            torch.empty(max(buf.numel, 1), dtype=buf.dtype, device=device)
        if buf.zeroed:
            tensors[name].zero_()
    bias = torch.randn(b_shape[1], generator=harness.generator(case["seed"], 0, 22)) if case["bias"] else None
    ctx.barrier()  # every rank's workspace is laid out before any rank's kernel writes into it
    violations = harness.attempt(getattr(ctx.ops, op), out, a, b, bias=None if bias is None else bias.to(device),
                                 config=config, workspace=Workspace(key, tensors))
    ctx.barrier()  # peers' stores into a heap output have landed
    ref = reference(op, [_shards(case, r, a_shape, b_shape) for r in range(world)], bias, rank)
    scale = magnitude(op, [_shards(case, r, a_shape, b_shape) for r in range(world)], bias, rank)
    got = out.cpu()
    if got.isnan().any():
        violations.append(f"{int(got.isnan().sum())} of {got.numel()} output elements never written")
    else:
        error = ((got.double() - ref).norm() / max(scale.norm().item(), 1e-30)).item()
        if error > TOLERANCE[dtype]:
            violations.append(f"{op}: error {error:.3g} against the float64 reference, relative to its terms' "
                              f"magnitude (allowed {TOLERANCE[dtype]:g})")
    return harness.Verdict(violations, value=got)


@st.composite
def fused_op_cases(draw):
    case = dict(op=draw(st.sampled_from(OPS)), m=draw(st.integers(1, 48)), n=draw(st.integers(1, 48)),
                k=draw(st.integers(1, 40)), out_dtype=draw(st.sampled_from((torch.float32, torch.bfloat16))),
                bias=draw(st.booleans()), comm_programs=draw(st.sampled_from((0, 0, 1, 3))), seed=draw(harness.seeds()))
    # owner-reduce (matmul_all_reduce without communication programs): forced on, off, or by world size
    case["reduce_at_owner"] = None if case["comm_programs"] else draw(st.sampled_from((None, True, False)))
    case["tma_loads"] = draw(st.booleans())  # taken where the operands' rows are 16-byte aligned
    # K in parts: each tile's (matmul_all_gather, gemm_all_scatter), the last tile's by member slice
    # (all_gather_matmul); the reduce ops take no split. Not with descriptors
    case["split_k"] = None if case["tma_loads"] else draw(st.sampled_from((None, None, 2, 3)))
    # copies where the op's default takes them (the reduce ops from two waves of a member's columns,
    # all_gather_matmul up to 1024 rows), or the programs' pushes forced
    case["copy_engine"] = draw(st.sampled_from((None, None, False)))
    # all_gather_matmul multiplied by torch's GEMM where the op's default takes it, or Iris's kernel forced
    case["vendor_gemm"] = draw(st.sampled_from((None, None, False)))
    # matmul_all_reduce by row chunks, each summed by iris.ccl.all_reduce, or the fused kernel asked for (0);
    # no effect on the other ops
    pipelines = case["comm_programs"] == 0 and not case["reduce_at_owner"]
    case["pipeline_chunks"] = draw(st.sampled_from((None, None, None, 0, 2, 3))) if pipelines else None
    # the SMs the pipeline's GEMM leaves to the sums (its programs on a GPU), where the pipeline is asked for
    case["pipeline_comm_sms"] = draw(st.sampled_from((None, 8, 64))) if case["pipeline_chunks"] else None
    return case


@settings(max_examples=current().examples(5))
@given(data=st.data())
def test_fused_ops_match_the_float64_reference(world, data):
    """Every rank gets its float64 answer (A @ B summed, gathered or scattered, + bias) within rounding."""
    case = data.draw(fused_op_cases(), label="case")
    outputs = world.check(_fused_op_on_rank, case)
    if case["op"] in SAME_ON_EVERY_RANK:
        for rank, out in enumerate(outputs[1:], start=1):
            assert torch.equal(out.view(torch.uint8), outputs[0].view(torch.uint8)), f"rank {rank}'s bits differ"
