"""Device tracing (iris.host.tracing): what a traced kernel records, the exported timeline, and that a kernel
built without tracing is the kernel it was before tracing existed."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import triton
import triton.language as tl

import iris
from iris.ops import FusedConfig
from iris.testing.fused_ops import copy_refusal_in
from iris.host.tracing import summarize

BLOCK = 64


@triton.jit
def _ring_handoff(context, data, flag, rank: tl.constexpr, world: tl.constexpr, BLOCK: tl.constexpr):
    """Each rank puts its block into the next rank's and signals it, then waits for its own signal."""
    ctx = iris.DeviceContext.initialize(context, rank, world, tracing=True)
    offs = tl.arange(0, BLOCK)
    nxt = (rank + 1) % world
    ctx.put(data + offs, data + offs + BLOCK, nxt)
    ctx.signal(flag, 1, nxt)
    ctx.wait_until(flag, "==", 1)


def _traced_on_rank(tmp: str, max_events: int):
    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    ctx.tracing.enable(max_events=max_events)
    data = ctx.full((2 * BLOCK,), float(rank))
    flag = ctx.zeros(1, dtype=torch.int32)
    ctx.barrier()
    _ring_handoff[(1,)](ctx.get_device_context(), data, flag, rank=rank, world=world, BLOCK=BLOCK)
    ctx.barrier()
    events = ctx.tracing.events()
    merged = ctx.tracing.export(os.path.join(tmp, "trace.json"), merge=True)
    received = data[BLOCK:].unique().tolist()
    ctx.close()
    return dict(events=events, merged=merged, received=received)


def test_a_traced_handoff_records_every_op_and_the_flows(ranks, tmp_path):
    world = ranks.world_size
    results = ranks.run(_traced_on_rank, str(tmp_path), 100)
    for rank, found in enumerate(results):
        assert found["received"] == [float((rank - 1) % world)]  # tracing changed nothing the kernel did
        events = found["events"]
        assert [e["name"] for e in events] == ["put", "signal", "wait"]
        assert all(e["cur_rank"] == rank for e in events)
        assert [e["target_rank"] for e in events] == [(rank + 1) % world, (rank + 1) % world, rank]
        assert events[0]["payload_size"] == BLOCK * 4 and events[0]["offset"] is not None
        stamps = [e["timestamp"] for e in events]
        assert stamps == sorted(stamps) and all(e["end"] >= e["timestamp"] for e in events)
    merged = results[0]["merged"]["traceEvents"]
    assert {e["pid"] for e in merged if e.get("ph") == "X"} == set(range(world))
    starts = {e["id"]: e for e in merged if e.get("ph") == "s"}
    finishes = {e["id"]: e for e in merged if e.get("ph") == "f"}
    put_flows = {(starts[i]["pid"], finishes[i]["pid"]) for i in starts if starts[i]["name"] == "put -> wait"}
    assert put_flows == {(r, (r + 1) % world) for r in range(world)}  # from each put to the wait it released
    assert (tmp_path / "trace.json").exists() and (tmp_path / "trace_rank0.json").exists()


def _traced_kernel_with_tracing_off_on_rank():
    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    data = ctx.full((2 * BLOCK,), float(rank))
    flag = ctx.zeros(1, dtype=torch.int32)
    ctx.barrier()  # tracing never enabled: the context tensor's tracing fields are zeros
    _ring_handoff[(1,)](ctx.get_device_context(), data, flag, rank=rank, world=world, BLOCK=BLOCK)
    ctx.barrier()
    found = dict(events=ctx.tracing.events(), received=data[BLOCK:].unique().tolist())
    ctx.close()
    return found


def test_a_kernel_built_with_tracing_runs_and_records_nothing_until_tracing_is_enabled(ranks):
    for rank, found in enumerate(ranks.run(_traced_kernel_with_tracing_off_on_rank)):
        assert found == dict(events=[], received=[float((rank - 1) % ranks.world_size)])


def test_events_past_max_events_are_dropped(ranks, tmp_path):
    for found in ranks.run(_traced_on_rank, str(tmp_path), 2):
        assert [e["name"] for e in found["events"]] == ["put", "signal"]


def _traced_fused_op_on_rank(traced: bool, name: str):
    op = name.split()[0]  # all_gather_matmul's ways: by its programs, "... by copies", "... in parts" (split_k 2)
    config = None
    if op == "matmul_all_reduce":  # the pushing kernel's spans, or the partials by copies (two launches)
        config = FusedConfig(copy_engine=name.endswith("by copies"))
    if op == "all_gather_matmul":
        config = FusedConfig(copy_engine=name.endswith("by copies"), split_k=2 if name.endswith("in parts") else None)
    ctx = iris.iris(1 << 22)
    world, device = ctx.get_num_ranks(), ctx.get_device()
    if traced:
        ctx.tracing.enable(max_events=10_000)
    a = torch.full((40, 24), 0.5, dtype=torch.bfloat16, device=device)
    n = 72 if name.endswith("by copies") else 70  # by copies: columns divisible by the ranks
    b = torch.full((24 * (world if op == "all_gather_matmul" else 1), n), 1.0, dtype=torch.bfloat16, device=device)
    if op == "matmul_all_gather":  # every member's (40, n) product, stacked, on the heap
        out = ctx.empty(world * 40, n, dtype=torch.float32)
    else:
        out = torch.empty(40, n, dtype=torch.float32, device=device)
    getattr(ctx.ops, op)(out, a, b, config=config)
    ctx.barrier()
    events = ctx.tracing.events() if traced else []
    tiles = {(e["pid_m"], e["pid_n"]) for e in events if e["name"] == "compute"}
    want = 12.0 * (1 if op == "matmul_all_gather" else world)
    spec = ctx.ops.workspace_layout(op, out, a, b, config)[1]  # parts of tiles handed over (split K), if any
    found = dict(right=bool((out == want).all()), kinds=sorted({e["name"] for e in events}),
                 computes=sum(e["name"] == "compute" for e in events), tiles=len(tiles),
                 handed=spec["ready"].numel if "ready" in spec else 0,
                 pushes=sum(e["name"] == "put" for e in events),
                 spans=all(e["end"] >= e["timestamp"] > 0 for e in events if e["name"] == "compute"),
                 ranks={e["cur_rank"] for e in events}, summary=ctx.tracing.summary())
    ctx.close()
    return found


# What each fused op records at least, per program (entry barrier) and per tile (matmul_all_reduce also waits
# for the owner's sums where it reduces at owners: beyond 2 ranks). all_gather_matmul by copies: its entry
# barrier is a launch of its own before the copies, and the copies are the copy engine's: the kernel records
# its tiles and its waits for their flags. matmul_all_reduce by copies: the same barrier; its first launch
# records each other member's block's tiles, its second its own block's tiles, the waits for the copied
# partials, the sums and their stores to the other members.
FUSED_KINDS = {"matmul_all_reduce": ["barrier", "compute", "put", "reduce"],
               "all_gather_matmul": ["barrier", "compute", "wait"],
               "all_gather_matmul by copies": ["compute", "wait"],
               "all_gather_matmul in parts": ["barrier", "compute", "wait"],
               "matmul_all_reduce by copies": ["compute", "wait", "reduce", "put"],
               "matmul_all_gather": ["barrier", "compute", "put"]}


@pytest.mark.parametrize("op", sorted(FUSED_KINDS))
@pytest.mark.parametrize("traced", [True, False])
def test_a_fused_op_records_its_tiles_when_tracing_is_on(ranks, traced, op):
    """ctx.ops kernels record each tile's compute span and what moves it (push, reduction, wait) and the barrier."""
    refusal = copy_refusal_in(ranks) if op.endswith("by copies") else None
    if refusal:
        pytest.skip(refusal)
    for rank, found in enumerate(ranks.run(_traced_fused_op_on_rank, traced, op)):
        assert found["right"]
        if not traced:
            assert found["kinds"] == [] and found["computes"] == 0
            continue
        assert set(FUSED_KINDS[op]) <= set(found["kinds"]) <= set(FUSED_KINDS[op]) | {"wait"}, found
        if op == "matmul_all_reduce by copies":  # every member's block's tiles once (the tiles of a block)
            assert found["computes"] == ranks.world_size * found["tiles"] and found["tiles"] >= 1, found
        else:  # every tile, once, on every rank (a tile split in K parts: each part once)
            assert found["computes"] == found["tiles"] + found["handed"] and found["tiles"] >= 1, found
        if not op.startswith("all_gather_matmul"):  # each tile's partial or result (own block's sum) pushed once
            assert found["pushes"] == found["tiles"], found
        assert found["spans"] and found["ranks"] == {rank}, found
        kinds = found["summary"]["kinds"]
        assert kinds["compute"]["count"] == found["computes"] and set(kinds) <= set(found["kinds"]), found

def _traced_vendor_gather_on_rank(traced: bool):
    """all_gather_matmul by the vendor's GEMM, traced or not: its waits for each member's slice."""
    ctx = iris.iris(1 << 22)
    world, device = ctx.get_num_ranks(), ctx.get_device()
    if traced:
        ctx.tracing.enable(max_events=1000)
    a = torch.full((40, 24), 0.5, dtype=torch.bfloat16, device=device)
    b = torch.full((24 * world, 72), 1.0, dtype=torch.bfloat16, device=device)
    out = torch.empty(40, 72, dtype=torch.bfloat16, device=device)
    ctx.ops.all_gather_matmul(out, a, b, config=FusedConfig(vendor_gemm=True))
    ctx.barrier()
    events = ctx.tracing.events() if traced else []
    found = dict(right=bool((out == 12.0 * world).all()), kinds=sorted({e["name"] for e in events}),
                 waited_for=sorted(e["target_rank"] for e in events if e["name"] == "wait"),
                 spans=all(e["end"] >= e["timestamp"] > 0 for e in events),
                 ranks={e["cur_rank"] for e in events})
    ctx.close()
    return found


@pytest.mark.parametrize("traced", [True, False])
def test_all_gather_matmul_by_the_vendors_gemm_records_its_wait_for_each_members_slice(ranks, traced):
    """torch's GEMM and the copy engine record nothing; the one-program kernel before each member's product
    records its wait for that member's slice (target_rank: the member), the span the slice took to come."""
    refusal = copy_refusal_in(ranks)
    if refusal:
        pytest.skip(refusal)
    for rank, found in enumerate(ranks.run(_traced_vendor_gather_on_rank, traced)):
        assert found["right"], found
        if not traced:
            assert found["kinds"] == [], found
            continue
        others = sorted(set(range(ranks.world_size)) - {rank})
        assert found["kinds"] == ["wait"] and found["waited_for"] == others, found
        assert found["spans"] and found["ranks"] == {rank}, found


def _traced_collectives_on_rank(tmp: str):
    """Each collective called once untraced (its launches remembered), then again with tracing on."""
    from iris.ccl import Config

    ctx = iris.iris(1 << 22)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    x = ctx.full((1000,), float(rank + 1))
    out = ctx.zeros(1000)
    gathered = ctx.zeros(world * 1000)
    # all_reduce named: the default variant at 2 ranks for small messages is push (no barrier), timed below
    fused = Config(block_size=256, all_reduce_variant="two_shot")
    unfused = Config(block_size=256, fused_bytes=0, all_reduce_variant="two_shot")
    calls = {"all_reduce": lambda config: ctx.ccl.all_reduce(out, x, config=config),
             "all_gather": lambda config: ctx.ccl.all_gather(gathered, x, config=config),
             "reduce_scatter": lambda config: ctx.ccl.reduce_scatter(out[:1000 // world], x[:1000 // world * world],
                                                                     config=config),
             "push": lambda config: ctx.ccl.all_reduce(out, x, config=Config(all_reduce_variant="push",
                                                                            block_size=256))}
    found = {}
    for name, call in calls.items():
        for label, config in (("fused", fused), ("unfused", unfused)):
            ctx.tracing.disable()
            call(config)  # untraced, remembered
            ctx.barrier()
            ctx.tracing.enable(max_events=1000)
            call(config)  # the same call: must not replay the untraced launches
            ctx.barrier()
            found[f"{name} {label}"] = sorted({e["name"] for e in ctx.tracing.events()})
            right = bool((out == world * (world + 1) / 2).all()) if name in ("all_reduce", "push") else True
            found[f"{name} {label} right"] = right
    merged = ctx.tracing.export(os.path.join(tmp, "push.json"), merge=True)  # the last call: push
    ctx.close()
    return found, merged


def test_the_collectives_record_their_barriers_and_pieces_when_tracing_is_on(ranks, tmp_path):
    """ccl kernels built with tracing record a span per piece (and, fused, the barrier rounds); push records its
    puts, signals, waits and reduction, and the merged timeline draws the flow from each signal to its wait."""
    for rank, (found, merged) in enumerate(ranks.run(_traced_collectives_on_rank, str(tmp_path))):
        assert all(found[key] for key in found if key.endswith("right")), found
        assert found["all_reduce fused"] == ["barrier", "reduce"], found
        assert found["all_reduce unfused"] == ["reduce"], found  # its barriers are launches of their own
        assert found["all_gather fused"] == ["barrier", "put"], found
        assert found["reduce_scatter fused"] == ["barrier", "reduce"], found
        assert found["push fused"] == ["put", "reduce", "signal", "wait"], found
        flows = [e for e in merged["traceEvents"] if e.get("cat") == "flow" and e["ph"] == "s"]
        assert len(flows) >= ranks.world_size * (ranks.world_size - 1), merged["traceEvents"][-8:]


PROBE = '''
import re
import triton, triton.language as tl
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
import iris
from iris.host.tracing import summarize


@triton.jit
def through_context(context, data, flag, rank: tl.constexpr, world: tl.constexpr, TRACED: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context, rank, world, tracing=TRACED)
    offs = tl.arange(0, 64)
    ctx.put(data + offs, data + offs, 1)
    ctx.signal(flag, 1, 1)
    ctx.wait_until(flag, "==", 1)
    x = ctx.load(data + offs, 1)
    ctx.atomic_add(flag, 1, 1)
    ctx.atomic_cas(flag, 0, 1, 1)
    tl.store(data + offs, x)


@triton.jit
def without_tracing(context, data, flag, rank: tl.constexpr, world: tl.constexpr, TRACED: tl.constexpr):
    heap_bases = context + 2
    offs = tl.arange(0, 64)
    iris.put(data + offs, data + offs, rank, 1, heap_bases)
    iris.signal(flag, 1, rank, 1, heap_bases)
    iris.wait_until(flag, "==", 1)
    x = iris.load(data + offs, rank, 1, heap_bases)
    iris.atomic_add(flag, 1, rank, 1, heap_bases)
    iris.atomic_cas(flag, 0, 1, rank, 1, heap_bases)
    tl.store(data + offs, x)


def ttir(kernel, target, traced):
    """The kernel's Triton IR with names that only say where a value came from taken out."""
    sig = {"context": "*i64", "data": "*fp32", "flag": "*i32", "rank": "constexpr", "world": "constexpr",
           "TRACED": "constexpr"}
    compiled = triton.compile(ASTSource(kernel, sig, {"rank": 0, "world": 2, "TRACED": traced}), target=target)
    text = re.sub(r"\\s*loc\\([^()]*(\\([^()]*\\)[^()]*)*\\)", "", compiled.asm["ttir"])
    text = "\\n".join(line for line in text.splitlines() if not line.startswith("#loc"))
    text = text.replace(kernel.__name__, "KERNEL")
    constants = dict(re.findall(r"^\\s*(%[\\w.]+) = arith.constant (.+)$", text, re.MULTILINE))
    body = [line for line in text.splitlines() if " = arith.constant " not in line]
    names = {name: f"%const<{value}>" for name, value in constants.items()}
    body = [re.sub(r"%[\\w.]+", lambda m: names.setdefault(m.group(0), f"%v{len(names)}"), line) for line in body]
    return "\\n".join(sorted(set(constants.values())) + body)


backend, _, arch = TARGET.partition(":")
target = GPUTarget(backend, int(arch) if arch.isdigit() else arch, 32 if backend == "cuda" else 64)
plain = ttir(without_tracing, target, False)
print("off", "IDENTICAL" if ttir(through_context, target, False) == plain else "DIFFERENT")
print("on", "IDENTICAL" if ttir(through_context, target, True) == plain else "DIFFERENT")
'''


@pytest.mark.slow
@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_without_tracing_the_kernel_compiles_to_what_it_was(tmp_path, target):
    """A DeviceContext kernel built without tracing has the Triton IR of the same kernel written with the
    functional ops (which record nothing), for each GPU target; with tracing it differs (the check can fail)."""
    probe = tmp_path / "ttir_probe.py"
    probe.write_text(f"TARGET = {target!r}\n" + textwrap.dedent(PROBE))
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "IRIS_CROSS_COMPILE")}
    env["IRIS_COMPILE_TARGET"] = target  # kernels become that target's code here, as in a cross-compile worker
    out = subprocess.run([sys.executable, str(probe)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["off", "IDENTICAL", "on", "DIFFERENT"], out.stdout + out.stderr[-2000:]


def _span(name, pid, start, end):
    return {"name": name, "pid": pid, "timestamp": start, "end": end}


def test_summary_says_where_the_time_went_per_kind_of_span():
    """summarize(): per kind the count, mean and time per program; the whole span; the time no span covers
    (nested spans counted once); the tail after the last compute."""
    events = [_span("barrier", 0, 1000, 2000), _span("compute", 0, 2000, 6000), _span("put", 0, 6000, 7000),
              _span("compute", 1, 1000, 5000), _span("wait", 1, 2000, 3000),  # nested in the compute
              _span("reduce", 1, 8000, 11000), {"name": "signal", "pid": 1, "timestamp": 7000, "end": 0}]
    summary = summarize(events)
    assert summary["programs"] == 2 and summary["span_us"] == 10.0
    assert summary["kinds"]["compute"] == {"count": 2, "mean_us": 4.0, "per_program_us": 4.0}
    assert summary["kinds"]["wait"] == {"count": 1, "mean_us": 1.0, "per_program_us": 0.5}
    assert "signal" not in summary["kinds"]  # an instant takes no time
    assert summary["tail_us"] == 5.0  # the last compute ends at 6000, the last span at 11000
    # program 0 is covered 1000-7000 (6 us of 10), program 1 1000-5000 and 8000-11000 (7 us of 10)
    assert summary["idle_us"] == 3.5
    assert summarize([]) == {"span_us": 0.0, "programs": 0, "tail_us": 0.0, "idle_us": 0.0,
                                          "kinds": {}}
