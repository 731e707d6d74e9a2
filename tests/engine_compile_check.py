"""Compile Iris's device ops with the engine path on (iris.device.nvshmem), for sm_90, on the CPU: run by
tests/test_heap_providers.py in a process of its own (the switch is for the whole process)."""

import os

os.environ.setdefault("IRIS_COMPILE_TARGET", "cuda:90")
os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch.distributed._symmetric_memory._nvshmem_triton import NvshmemLibFinder  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import iris  # noqa: E402
from iris.device import rma, sync  # noqa: E402

from iris.memory.providers.engine_library import slim_library  # noqa: E402

rma.ENGINE = tl.constexpr(True)
SM_90 = GPUTarget("cuda", 90, 32)
WHOLE = NvshmemLibFinder.find_device_library()
SLIM = slim_library(WHOLE, SM_90)
assert SLIM != WHOLE and os.path.getsize(SLIM) < os.path.getsize(WHOLE) // 20, (SLIM, WHOLE)
OPTIONS = {"extern_libs": {"libnvshmem_device": SLIM}}



@triton.jit
def every_op(buf, fbuf, hbuf, peer, heap_bases, BLOCK: tl.constexpr):
    cur = iris.current_rank(heap_bases)
    offs = tl.arange(0, BLOCK)
    m = offs < 100
    v = iris.load(buf + offs, cur, peer, heap_bases, mask=m, other=-1)
    iris.store(buf + BLOCK + offs, v + 1, cur, peer, heap_bases, mask=m)
    iris.store(hbuf + offs, 1.5, cur, peer, heap_bases)
    iris.get(buf + offs, buf + 2 * BLOCK + offs, peer, cur, heap_bases, mask=m)
    iris.put(buf + offs, buf + 3 * BLOCK + offs, cur, peer, heap_bases, mask=m)
    iris.copy(buf + offs, buf + 4 * BLOCK + offs, peer, cur, cur, heap_bases, mask=m)
    a = iris.atomic_add(buf + offs, 1, cur, peer, heap_bases, mask=m, sem="relaxed", scope="sys")
    b = iris.atomic_add(fbuf + offs, 0.5, cur, peer, heap_bases, mask=m)
    c = iris.atomic_min(fbuf + offs, -1.0, cur, peer, heap_bases)
    d = iris.atomic_xchg(buf + offs, 7, cur, peer, heap_bases, mask=m)
    e = iris.atomic_cas(buf + offs, 7, 8, cur, peer, heap_bases)
    f = iris.atomic_xor(buf + offs, 3, cur, peer, heap_bases) + iris.atomic_max(buf + offs, 3, cur, peer, heap_bases)
    s = iris.atomic_add(buf, 1, cur, peer, heap_bases)  # scalar
    x = iris.load(buf, cur, peer, heap_bases)  # scalar
    tl.store(buf + 5 * BLOCK + offs, a + d + e + f + s + x)
    tl.store(fbuf + BLOCK + offs, b + c)
    h = iris.atomic_add(hbuf + offs, 1.0, cur, peer, heap_bases) + iris.atomic_cas(hbuf + offs, 1.0, 2.0, cur, peer,
                                                                                   heap_bases)
    tl.store(hbuf + BLOCK + offs, h)
    iris.signal(buf + 6 * BLOCK, 1, cur, peer, heap_bases)
    iris.signal(buf + 6 * BLOCK, 1, cur, peer, heap_bases, op="add")
    iris.wait_until(buf + 6 * BLOCK, ">=", 1)
    tile = tl.arange(0, 4)[:, None] * 32 + tl.arange(0, 32)[None, :]  # a 2-D tile (rows of a run, or not)
    iris.get(fbuf + tile, fbuf + 2 * BLOCK + tile, peer, cur, heap_bases)
    iris.put(hbuf + 2 * BLOCK + tile, hbuf + 3 * BLOCK + tile, cur, peer, heap_bases, mask=tile < 100)


sig = {"buf": "*i32", "fbuf": "*fp32", "hbuf": "*bf16", "peer": "i32", "heap_bases": "*i64", "BLOCK": "constexpr"}
for kernel, signature, constants in (
    (every_op, sig, {"BLOCK": 128}),
    (sync.barrier_kernel, {"arrivals": "*i64", "expected": "*i64", "members": "*i32", "count": "i32", "cur": "i32",
                           "heap_bases": "*i64", "BLOCK": "constexpr"}, {"BLOCK": 8}),
):
    src = ASTSource(kernel, signature, constants)
    compiled = triton.compile(src, target=SM_90, options=OPTIONS)
    ptx = compiled.asm["ptx"]
    calls = sorted({w.split("(")[0] for w in ptx.split() if w.startswith("nvshmem")})
    print(kernel.fn.__name__, "compiled for sm_90:", len(ptx), "bytes of PTX;", "nvshmemi_device_state" in ptx,
          calls[:12])


@triton.jit
def bools(buf, peer, heap_bases, BLOCK: tl.constexpr):
    cur = iris.current_rank(heap_bases)
    offs = tl.arange(0, BLOCK)
    v = iris.load(buf + offs, cur, peer, heap_bases)
    iris.store(buf + BLOCK + offs, v, cur, peer, heap_bases, mask=offs < 3)


compiled = triton.compile(ASTSource(bools, {"buf": "*i1", "peer": "i32", "heap_bases": "*i64", "BLOCK": "constexpr"},
                                    {"BLOCK": 64}), target=SM_90,
                          options=OPTIONS)
print("bools compiled for sm_90")

# The collectives' writes toward other members go out as block transfers from memory (one putmem per block
# and peer across nodes, not one message per element): two_shot's, ring's and all_gather's, push's, and the
# reducing fused ops' partial tiles (owner-reduce's sums too, one putmem per tile row); the collectives'
# reads of other members' blocks come in as block transfers too (one getmem per block and peer into a staging
# slot of the reader's heap): one_shot's, two_shot's and reduce_scatter's.
from iris.ccl.all_gather import _all_gather_kernel  # noqa: E402
from iris.ccl.all_reduce.kernel import _all_reduce_kernel  # noqa: E402
from iris.ccl.all_reduce.push import _all_reduce_push_kernel  # noqa: E402
from iris.ccl.reduce_scatter import _reduce_scatter_kernel  # noqa: E402

group = {"members": "*i32", "count": "i32", "index": "i32", "cur": "i32", "heap_bases": "*i64"}
barrier = {"arrivals": "*i64", "expected": "*i64", "programs": "i32"}
launch = {"FUSED": True, "EXIT_BARRIER": True, "WORLD": 2, "BARRIER_BLOCK": 16, "TRACE": False, "BLOCK": 1024}


def all_reduce(dtype, variant, op="sum"):
    """_all_reduce_kernel's signature and constants for ``variant``."""
    return (_all_reduce_kernel, {"src": dtype, "dst": dtype, "numel": "i32", "chunk": "i32", **group,
                                 "locks": "*i32", "flags": "*i64", "counts": "*i64", **barrier},
            {**launch, "VARIANT": variant, "OP": op, "ACC": tl.float32})


def matmul_reduce(scatter, owner, comm_programs=0):
    """_matmul_reduce_kernel's signature and constants (bf16 operands, a small tile, no TMA)."""
    from iris.ops.matmul_all_reduce.kernel import _matmul_reduce_kernel

    ints = {"M", "N", "K", "width", "count", "index", "cur", "run_m", "run_n", "runs_n", "per_rank"} | {
        n for n in _matmul_reduce_kernel.arg_names if n.startswith("stride")}
    kinds = {"flags": "*i64", "seen": "*i64", "ready": "*i32", "calls": "*i64", "members": "*i32",
             "heap_bases": "*i64", "arrivals": "*i64", "expected": "*i64"}
    constants = {"SCATTER": scatter, "OWNER": owner, "RUNS": False, "TRACE": False, "TMA": False, "HAS_BIAS": False,
                 "UPCAST": False, "WORLD": 2, "BARRIER_BLOCK": 16, "COMM_PROGRAMS": comm_programs, "BLOCK_M": 64,
                 "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 4}
    signature = {n: "i32" if n in ints else kinds.get(n, "*bf16") for n in _matmul_reduce_kernel.arg_names
                 if n not in constants}
    return _matmul_reduce_kernel, signature, constants


PUT, GET = "nvshmemx_putmem_block", "nvshmemx_getmem_block"
steps = {"src_step": "i64", "dst_step": "i64"}  # all_gather's and reduce_scatter's repeats
calls = {}  # call sites of the block transfer, per case
for symbol, (kernel, signature, constants) in (
    (PUT, matmul_reduce(scatter=False, owner=False)),  # the fused ops' partial tiles (and owner's sums)
    (PUT, matmul_reduce(scatter=False, owner=True)),
    (PUT, matmul_reduce(scatter=True, owner=False)),
    (PUT, matmul_reduce(scatter=False, owner=False, comm_programs=1)),
    (PUT, all_reduce("*bf16", "two_shot")),
    (PUT, all_reduce("*fp32", "ring")),
    (PUT, (_all_gather_kernel, {"src": "*bf16", "dst": "*bf16", "numel": "i32", "stride": "i32", **steps, **group,
                                 **barrier},
           {**launch, "CACHE": ""})),
    (PUT, (_all_reduce_push_kernel, {"src": "*bf16", "dst": "*bf16", "numel": "i32", "blocks": "i32", **group,
                                     "landing": "*bf16", "flags": "*i32", "counts": "*i32"},
           {"WORLD": 2, "PROGRAMS": 32, "CAPACITY": 131072, "OP": "sum", "ACC": tl.float32, "BLOCK": 1024,
            "TRACE": False})),
    (GET, all_reduce("*bf16", "one_shot")),
    (GET, all_reduce("*fp32", "two_shot", "max")),
    (GET, (_reduce_scatter_kernel, {"src": "*bf16", "dst": "*bf16", "numel": "i32", **steps, **group, **barrier},
           {**launch, "OP": "sum", "ACC": tl.float32})),
):
    signature.update({name: "constexpr" for name in constants})
    ptx = triton.compile(ASTSource(kernel, signature, constants), target=SM_90, options=OPTIONS).asm["ptx"]
    way = "writes" if symbol == PUT else "reads"
    case = constants.get("VARIANT") or " ".join(f"{k}={constants[k]}" for k in ("SCATTER", "OWNER", "COMM_PROGRAMS")
                                                if k in constants)
    assert symbol in ptx, f"{kernel.fn.__name__} {case}: no block {way} toward other nodes"
    print(kernel.fn.__name__, case, f"compiled for sm_90 with block {way} toward other nodes")
    calls[case] = ptx.count(symbol)
# all_reduce's ll variant writes each word (an element beside its flag) toward another node as one 8-byte put.
from iris.ccl.all_reduce.push import _all_reduce_ll_kernel  # noqa: E402

ll_constants = {"WORLD": 2, "PROGRAMS": 32, "CAPACITY": 131072, "OP": "sum", "ACC": tl.float32, "PACK": 2,
                "BLOCK": 1024, "TRACE": False}
ll_signature = {"src": "*bf16", "dst": "*bf16", "numel": "i32", "blocks": "i32", **group, "landing": "*i64",
                "counts": "*i32", **{name: "constexpr" for name in ll_constants}}
ptx = triton.compile(ASTSource(_all_reduce_ll_kernel, ll_signature, ll_constants), target=SM_90,
                     options=OPTIONS).asm["ptx"]
assert "nvshmem_uint64_p" in ptx, "_all_reduce_ll_kernel: its words do not go out as 8-byte puts toward other nodes"
print("_all_reduce_ll_kernel compiled for sm_90 with 8-byte puts toward other nodes")
# Owner-reduce's owner sends its sums as block puts as well: call sites beyond the partial tiles' own.
push_to_all, owner = "SCATTER=False OWNER=False COMM_PROGRAMS=0", "SCATTER=False OWNER=True COMM_PROGRAMS=0"
assert calls[owner] > calls[push_to_all], calls

# The cut library is the whole one for every call the engine makes: the same PTX, to the byte, but for the
# debug information, which names the source files by path (Triton's cache keys on the source, not on where it
# lies: a kernel compiled from another checkout or venv comes back from the cache with that one's paths).


def code_of(ptx: str) -> str:
    return "\n".join(line for line in ptx.split("\t.section\t.debug")[0].splitlines()
                     if not line.lstrip().startswith(".file"))


src = ASTSource(every_op, sig, {"BLOCK": 128})
with_slim = code_of(triton.compile(src, target=SM_90, options=OPTIONS).asm["ptx"])
assert code_of(triton.compile(src, target=SM_90, options={"extern_libs": {"libnvshmem_device": WHOLE}}).asm["ptx"]) \
    == with_slim
print("the cut library gives the same PTX as the whole one")
