"""Collectives (iris.ccl): every member's result equals a float64 torch reference, for any group.

Each case draws a collective, a dtype, a shape that the group size and block sizes need not
divide, and the participating ranks (all, or a torch.distributed group of some of them). Every
rank knows every rank's input (seeded), so each member checks its own result:
- all_gather, all_to_all, broadcast, gather, scatter move bytes: the result is bit-exact (gather's output off
  its root, like reduce's, keeps the poison it held);
- all_reduce, reduce_scatter, reduce: inputs are small multiples of 1/4, so the float32 (int32) accumulation
  is exact and the result must equal the float64 reference rounded once to the dtype, bit for bit, on every
  member (so every member also holds the same bits). all_reduce's atomic, spinlock and ring variants
  keep partial sums in the output's dtype (atomic and spinlock in whatever order members'
  updates land): their inputs are smaller (within +-4), so that every partial sum of up to 8
  members is exact even in bfloat16.
  Where the backend cannot do the atomic variant's dtype or op, the property is its refusal
  (a TypeError naming the variant, before any launch), per iris.runtime.capabilities; for members on several nodes
  (IRIS_NODE_MAP=0,1 with the shmem heap), the refusal of the variants all_reduce refuses there (a ValueError,
  per iris.ccl.all_reduce.far_path_refusal).
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance import harness
from conformance.dtypes import element_size, values
from conformance.profiles import current
from iris.runtime.capabilities import find_limitation
from iris.ccl import Config, ReduceOp
from iris.ccl.all_reduce import far_path_refusal
from iris.runtime import SELECTED

REDUCE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32)
MOVE_DTYPES = REDUCE_DTYPES + (torch.float8_e4m3fn, torch.float8_e5m2)
REDUCING = ("all_reduce", "reduce_scatter", "reduce")
# all_reduce variants that round partial sums in the output's dtype (atomic, spinlock: in any order)
STEPWISE = ("atomic", "spinlock", "ring")
POISON = 0xA5  # the bytes of reduce_scatter's output that the original layout leaves alone
TILE, SWIZZLE = (16, 32), 4  # the Config's tile (block_size_m, block_size_n) and its default swizzle_size
ALIGN = 256

def _input(case, rank: int) -> torch.Tensor:
    """Rank ``rank``'s input (CPU): small multiples of 1/4 for reductions, any bit pattern for moves."""
    width = len(case["members"])
    shape = (case["m"], case["n"] * (width if case["op"] == "all_to_all" else 1))
    if case["op"] == "scatter" or case["op"] == "reduce_scatter" and case["layout"] == "torch":
        shape = (case["m"] * width, case["n"])
    g = harness.generator(case["seed"], rank, 11)
    count = shape[0] * shape[1]
    if case["op"] in REDUCING:
        bound = 16 if case.get("variant") in STEPWISE else 64
        quarters = torch.randint(-bound, bound + 1, (count,), generator=g)
        data = quarters.to(torch.int32) if case["dtype"] == torch.int32 else (quarters / 4).to(case["dtype"])
    else:
        data = values(case["dtype"], count, g)
    return data.view(shape)


def _poison(shape, dtype) -> torch.Tensor:
    count = torch.Size(shape).numel()
    return torch.full((count * element_size(dtype),), POISON, dtype=torch.uint8).view(dtype).view(shape)


def _expected(case, rank: int) -> torch.Tensor:
    members, op = case["members"], case["op"]
    inputs = [_input(case, r) for r in members]
    if op == "all_gather":
        return torch.cat(inputs)
    if op == "gather":
        gathered = torch.cat(inputs)
        return gathered if rank == case["root"] else _poison(gathered.shape, case["dtype"])
    if op == "scatter":
        me, m = members.index(rank), case["m"]
        return _input(case, case["root"])[me * m:(me + 1) * m]
    if op == "broadcast":
        return inputs[members.index(case["src"])]
    if op == "all_to_all":
        me, n = members.index(rank), case["n"]
        return torch.cat([x[:, me * n:(me + 1) * n] for x in inputs], dim=1)
    stacked = torch.stack([x.double() for x in inputs])
    reduced = {"sum": stacked.sum(0), "max": stacked.max(0).values, "min": stacked.min(0).values}[case["reduce"]]
    reduced = reduced.to(case["dtype"])
    if op == "all_reduce":
        return reduced
    if op == "reduce":
        return reduced if rank == case["root"] else _poison(reduced.shape, case["dtype"])
    me, width = members.index(rank), len(members)
    if case["layout"] == "torch":
        return reduced[me * case["m"]:(me + 1) * case["m"]]
    # the original's layout: this member's tiles of TILE (block distribution, tile rows in bands of SWIZZLE,
    # column by column inside a band); the rest keeps the poison
    out = torch.full((reduced.numel() * element_size(case["dtype"]),), POISON, dtype=torch.uint8)
    out = out.view(case["dtype"]).view(reduced.shape).clone()
    (bm, bn), rows, cols = TILE, -(-case["m"] // TILE[0]), -(-case["n"] // TILE[1])
    per = -(-rows * cols // width)
    for tile in range(me * per, min(rows * cols, (me + 1) * per)):
        band, inside = divmod(tile, SWIZZLE * cols)
        height = min(rows - band * SWIZZLE, SWIZZLE)
        tm, tn = band * SWIZZLE + inside % height, inside // height
        out[tm * bm:(tm + 1) * bm, tn * bn:(tn + 1) * bn] = reduced[tm * bm:(tm + 1) * bm, tn * bn:(tn + 1) * bn]
    return out


def _collective_on_rank(case):
    ctx = harness.context()
    rank, device = ctx.get_rank(), ctx.get_device()
    members, op, dtype = case["members"], case["op"], case["dtype"]
    harness.fill_arena(case["seed"])
    group = harness.group(members)
    if rank not in members:
        return harness.Verdict([])
    mine = _input(case, rank)
    expected = _expected(case, rank)
    config = _config(case)
    out = harness.region(0, expected.numel(), dtype).view(expected.shape)
    src_offset = (expected.numel() * element_size(dtype) // ALIGN + 1) * ALIGN
    violations = []
    if op == "reduce_scatter":
        x = harness.region(src_offset, mine.numel(), dtype).view(mine.shape)
        x.copy_(harness.to_device(mine, device))
        out = harness.device_poison(expected.numel(), dtype, device).view(expected.shape)
        violations += harness.attempt(ctx.ccl.reduce_scatter, out, x, op=ReduceOp(case["reduce"]), group=group,
                                      config=config)
    elif op == "all_reduce":
        x = harness.region(src_offset, mine.numel(), dtype).view(mine.shape)
        x.copy_(harness.to_device(mine, device))
        target = x if case["in_place"] else out
        refused = None  # (the error all_reduce must raise, words of its message) where it must refuse the case
        if _far_path_refused(ctx.get_node_map(), case):
            refused = (ValueError, "refused for members on several nodes")
        elif _atomic_refusal(case):
            refused = (TypeError, "atomic variant")
        if refused:
            return harness.Verdict(_expect_refusal(ctx.ccl.all_reduce, *refused, target, x,
                                                   op=ReduceOp(case["reduce"]), group=group, config=config))
        violations += harness.attempt(ctx.ccl.all_reduce, target, x, op=ReduceOp(case["reduce"]), group=group,
                                      config=config)
        out = target
    elif op == "reduce":
        x = harness.region(src_offset, mine.numel(), dtype).view(mine.shape)
        x.copy_(harness.to_device(mine, device))
        out = harness.device_poison(expected.numel(), dtype, device).view(expected.shape)
        violations += harness.attempt(ctx.ccl.reduce, out, x, dst=case["root"], op=ReduceOp(case["reduce"]),
                                      group=group, config=config)
    elif op in ("gather", "scatter"):
        harness.byte_view(out).fill_(POISON)
        launch = ctx.ccl.gather if op == "gather" else ctx.ccl.scatter
        root = {"dst" if op == "gather" else "src": case["root"]}
        violations += harness.attempt(launch, out, harness.to_device(mine, device), group=group, config=config,
                                      **root)
    elif op == "broadcast":
        out.copy_(harness.to_device(mine, device))
        violations += harness.attempt(ctx.ccl.broadcast, out, src=case["src"], group=group, config=config)
    else:
        launch = ctx.ccl.all_gather if op == "all_gather" else ctx.ccl.all_to_all
        if case.get("copies") and not ctx.heap.maps(members):  # a member only the engine reaches: refused
            return harness.Verdict(_expect_refusal(launch, ValueError, "the copies variant copies into every "
                                                   "member's heap", out, harness.to_device(mine, device),
                                                   group=group, config=config))
        violations += harness.attempt(launch, out, harness.to_device(mine, device), group=group, config=config)
    ctx.device_barrier(group)
    size = element_size(dtype)
    got = harness.byte_view(harness.to_device(out, "cpu")).view(-1, size)
    want = harness.byte_view(expected).view(-1, size)
    wrong = (got != want).any(1).nonzero().flatten()
    if wrong.numel() and not violations:
        first = int(wrong[0])
        violations.append(f"{wrong.numel()} of {expected.numel()} elements wrong; element {first} is "
                          f"{harness.to_device(out, 'cpu').flatten()[first].item()}, expected "
                          f"{expected.flatten()[first].item()}")
    return harness.Verdict(violations)


def _config(case) -> Config:
    """The case's Config: its block sizes, fusing, and variant (all_reduce's, or the copy engine's for all_gather
    and all_to_all)."""
    copies = {f"{case['op']}_variant": "copies"} if case.get("copies") else {}
    return Config(block_size=case["block"], block_size_m=TILE[0], block_size_n=TILE[1],
                  all_reduce_variant=case.get("variant"), fused_bytes=case["fused_bytes"], **copies)


def _atomic_refusal(case) -> bool:
    """Whether all_reduce must refuse the case: the atomic variant where atomics cannot do it."""
    if case.get("variant") != "atomic":
        return False
    if case["reduce"] != "sum" and case["dtype"] not in (torch.float32, torch.int32):
        return True
    return find_limitation(SELECTED or "", "atomic", case["dtype"], concurrent=True) is not None


def _far_path_refused(node_map, case) -> bool:
    """Whether all_reduce must refuse the case's variant for its members: one of those it refuses for members on
    several nodes (``node_map``: ``ctx.get_node_map()``, the node of each rank)."""
    return far_path_refusal(case.get("variant"), len({node_map[m] for m in case["members"]}) > 1) is not None


def test_the_far_path_refusals_follow_the_members_nodes():
    """The conformance cases expect a refusal exactly where all_reduce refuses: a refused variant (ring here) over
    members on two nodes; not over members of one node, nor for a variant that runs there."""
    ring, two_shot = dict(variant="ring", members=(0, 1)), dict(variant="two_shot", members=(0, 1))
    assert _far_path_refused((0, 1), ring) and not _far_path_refused((0, 0), ring)
    assert not _far_path_refused((0, 1), dict(ring, members=(1,))) and not _far_path_refused((0, 1), two_shot)


def _expect_refusal(call, error, words, *args, **kwargs) -> list[str]:
    """No violation where ``call`` raises ``error`` with ``words`` in its message."""
    try:
        call(*args, **kwargs)
    except error as exc:
        return [] if words in str(exc) else [f"refused with an unexpected message: {exc}"]
    return [f"ran a case it must refuse ({error.__name__}: ...{words}...)"]


@st.composite
def collective_cases(draw, world_size: int):
    op = draw(st.sampled_from(("all_gather", "all_to_all", "broadcast", "all_reduce", "reduce_scatter", "reduce",
                               "gather", "scatter")))
    dtype = draw(st.sampled_from(REDUCE_DTYPES if op in REDUCING else MOVE_DTYPES))
    everyone = tuple(range(world_size))
    subset = st.lists(st.sampled_from(everyone), min_size=1, unique=True).map(lambda r: tuple(sorted(r)))
    members = draw(st.one_of(st.just(everyone), subset))
    case = dict(op=op, dtype=dtype, members=members, m=draw(st.integers(0, 40)), n=draw(st.integers(1, 70)),
                block=draw(st.sampled_from((64, 256))), seed=draw(harness.seeds()),
                fused_bytes=draw(st.sampled_from((0, 1 << 20))))  # three launches, or one fused launch
    if op == "broadcast":
        case["src"] = draw(st.sampled_from(members))
    if op in ("all_gather", "all_to_all"):
        case["copies"] = draw(st.booleans())  # by a kernel, or by the copy engine
    if op in ("reduce", "gather", "scatter"):
        case["root"] = draw(st.sampled_from(members))
    if op == "reduce":
        case["reduce"] = draw(st.sampled_from(("sum", "max", "min")))
    if op == "all_reduce":
        case.update(reduce=draw(st.sampled_from(("sum", "max", "min"))), in_place=draw(st.booleans()))
        variants = ("two_shot", "push", "ll") if case["in_place"] else ("one_shot", "two_shot", "push", "ll") + STEPWISE
        case["variant"] = draw(st.sampled_from(variants))
    if op == "reduce_scatter":
        layout = draw(st.sampled_from(("torch", "original"))) if len(members) > 1 else "torch"
        case.update(reduce=draw(st.sampled_from(("sum", "max", "min"))), layout=layout)
    return case


@settings(max_examples=current().examples(2))
@given(data=st.data())
def test_collectives_match_the_float64_reference(world, data):
    """all_gather, all_to_all, broadcast, gather, scatter, all_reduce, reduce_scatter and reduce (sum, max, min):
    any group and shape."""
    world.check(_collective_on_rank, data.draw(collective_cases(world.size), label="case"))


def _replayed_on_rank(case):
    """The collective captured once in a CUDA graph, then replayed on new inputs, checked after each replay."""
    ctx = harness.context()
    rank, device, op, dtype = ctx.get_rank(), ctx.get_device(), case["op"], case["dtype"]
    harness.fill_arena(case["seed"])
    config = _config(case)
    mine, expected = _input(case, rank), _expected(case, rank)
    out = harness.region(0, expected.numel(), dtype).view(expected.shape)
    x = harness.region((expected.numel() * element_size(dtype) // ALIGN + 1) * ALIGN, mine.numel(),
                       dtype).view(mine.shape)
    reduce = ReduceOp(case.get("reduce", "sum"))
    if (op == "all_reduce" and _far_path_refused(ctx.get_node_map(), case)) or (
            case.get("copies") and not ctx.heap.maps(case["members"])):  # refused there: the default runs instead
        config = Config(block_size=case["block"], fused_bytes=case["fused_bytes"])
    calls = {"all_reduce": lambda: ctx.ccl.all_reduce(out, x, op=reduce, config=config),
             "reduce_scatter": lambda: ctx.ccl.reduce_scatter(out, x, op=reduce, config=config),
             "broadcast": lambda: ctx.ccl.broadcast(out, src=case["src"], config=config),
             "all_gather": lambda: ctx.ccl.all_gather(out, x, config=config),
             "all_to_all": lambda: ctx.ccl.all_to_all(out, x, config=config)}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # a side stream does not follow the default one
    graph, violations = None, []
    for replay in range(case["replays"]):
        this = dict(case, seed=case["seed"] + replay)  # new inputs on every rank, every replay
        with torch.cuda.stream(stream):
            (out if op == "broadcast" else x).copy_(harness.to_device(_input(this, rank), device))
            if graph is None:  # the first call runs (and compiles) uncaptured, then the same call is captured
                violations += harness.attempt(calls[op])
                stream.synchronize()
                if violations:
                    break
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=stream):
                    calls[op]()
            else:
                graph.replay()
            stream.synchronize()
        got = harness.byte_view(harness.to_device(out, "cpu")).view(-1, element_size(dtype))
        want = harness.byte_view(_expected(this, rank)).view(-1, element_size(dtype))
        wrong = int((got != want).any(1).sum())
        if wrong and len(violations) < 4:
            violations.append(f"{'call' if replay == 0 else f'replay {replay}'}: {wrong} of {expected.numel()} "
                              "elements wrong")
    ctx.barrier()
    return harness.Verdict(violations)


@st.composite
def replayed_cases(draw, world_size: int):
    op = draw(st.sampled_from(("all_gather", "all_to_all", "broadcast", "all_reduce", "reduce_scatter")))
    case = dict(op=op, dtype=draw(st.sampled_from(REDUCE_DTYPES)), members=tuple(range(world_size)),
                m=draw(st.integers(1, 40)), n=draw(st.integers(1, 70)), block=draw(st.sampled_from((64, 256))),
                seed=draw(harness.seeds()), fused_bytes=draw(st.sampled_from((0, 1 << 20))),
                replays=draw(st.integers(2, 1 + current().barrier_rounds)))
    if op == "broadcast":
        case["src"] = draw(st.sampled_from(case["members"]))
    if op in ("all_gather", "all_to_all"):
        case["copies"] = draw(st.booleans())
    if op in REDUCING:
        case.update(reduce=draw(st.sampled_from(("sum", "max", "min"))), layout="torch")
    if op == "all_reduce":
        case["variant"] = draw(st.sampled_from(("one_shot", "two_shot", "push", "ll") + STEPWISE))
        if _atomic_refusal(case):
            case["variant"] = "two_shot"
    return case


@pytest.mark.parametrize("graphs", [pytest.param("cuda_graph", marks=harness.marks_for("cuda_graph"))])
@settings(max_examples=current().examples(2))
@given(data=st.data())
def test_collectives_replayed_in_a_cuda_graph_match_the_reference(world, graphs, data):
    """Every collective, captured in a CUDA graph with its barriers, gives the reference result on every replay."""
    world.check(_replayed_on_rank, data.draw(replayed_cases(world.size), label="case"))


def _all_to_all_v_on_rank(case):
    """all_to_all_v with the case's count matrix (``counts[i][j]``: rows member i sends member j), packed."""
    ctx = harness.context()
    rank, device = ctx.get_rank(), ctx.get_device()
    members, dtype, width, counts = case["members"], case["dtype"], case["width"], case["counts"]
    harness.fill_arena(case["seed"])
    group = harness.group(members)
    if rank not in members:
        return harness.Verdict([])
    me, size = members.index(rank), len(members)
    capacity = max(sum(row) for row in counts) + case["slack"]  # every member allocates the same input

    def input_of(i):
        return values(dtype, capacity * width, harness.generator(case["seed"], members[i], 13)).view(capacity, width)

    x = harness.region(0, capacity * width, dtype).view(capacity, width)
    x.copy_(harness.to_device(input_of(me), device))
    landed = sum(counts[i][me] for i in range(size))
    out = harness.device_poison((landed + case["slack"]) * width, dtype, device).view(-1, width)
    send = torch.tensor(counts[me], dtype=torch.int64, device=device) if case["device_counts"] else counts[me]
    received = torch.full((size,), -1, dtype=torch.int64, device=device)
    violations = harness.attempt(ctx.ccl.all_to_all_v, out, x, send, recv_counts=received, group=group,
                                 config=Config(block_size=case["block"], fused_bytes=case["fused_bytes"]))
    ctx.device_barrier(group)
    blocks = [input_of(i)[sum(counts[i][:me]):sum(counts[i][:me]) + counts[i][me]] for i in range(size)]
    want = torch.cat(blocks + [harness.device_poison(case["slack"] * width, dtype, "cpu").view(-1, width)])
    size_of = element_size(dtype)
    got = harness.byte_view(harness.to_device(out, "cpu")).view(-1, size_of)
    wrong = int((got != harness.byte_view(want).view(-1, size_of)).any(1).sum())
    if wrong and not violations:
        violations.append(f"{wrong} of {want.numel()} elements wrong")
    if not violations and received.tolist() != [counts[i][me] for i in range(size)]:
        violations.append(f"received counts {received.tolist()}, sent {[counts[i][me] for i in range(size)]}")
    return harness.Verdict(violations)


@st.composite
def all_to_all_v_cases(draw, world_size: int):
    everyone = tuple(range(world_size))
    subset = st.lists(st.sampled_from(everyone), min_size=1, unique=True).map(lambda r: tuple(sorted(r)))
    members = draw(st.one_of(st.just(everyone), subset))
    size = len(members)
    row = st.lists(st.integers(0, 12), min_size=size, max_size=size)
    return dict(members=members, counts=draw(st.lists(row, min_size=size, max_size=size)),
                width=draw(st.integers(1, 40)), dtype=draw(st.sampled_from(MOVE_DTYPES)), seed=draw(harness.seeds()),
                block=draw(st.sampled_from((64, 256))), fused_bytes=draw(st.sampled_from((0, 1 << 20))),
                slack=draw(st.integers(0, 3)), device_counts=draw(st.booleans()))


@settings(max_examples=current().examples(1))
@given(data=st.data())
def test_all_to_all_v_matches_the_reference(world, data):
    """all_to_all_v: any count matrix (empty rows included), row width, dtype and group; counts on the device or in
    lists; the received counts on the device."""
    world.check(_all_to_all_v_on_rank, data.draw(all_to_all_v_cases(world.size), label="case"))
