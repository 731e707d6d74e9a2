"""Soak: thousands of randomly chosen collectives in a row, every result checked, a watchdog on every call.

    iris run -n 2 benchmarks/soak.py [--calls 10000] [--max-bytes 64M] [--seed 0] [--timeout 60]
                                     [--progress 1000] [--kinds 8]

Each call draws, the same on every rank (one seeded generator per rank, drawn alike), a collective (all_reduce
with the default variant or one_shot, two_shot, push or ll where the size allows; all_gather, reduce_scatter,
broadcast from a random root, all_to_all, all_to_all_v with random counts on the device), a dtype (float32,
bfloat16, float16, int32), a size from 1 byte to --max-bytes per rank, log-uniform, so odd sizes dominate, and
a group (every rank, or a torch.distributed group of some of them: from 3 ranks). Every rank builds every
member's input from the call's seed, so each checks its own result against a torch reference, bit for bit:
sums are of small multiples of 1/4, exact in every dtype, and moves are of any bits. A watchdog thread names
the call (its number and what it was) and ends the process with exit code 3 when one, its synchronisation
included, takes longer than --timeout seconds: a hang shows which call it was. Inputs and outputs are carved
from two heap arenas made once, so no call allocates on the heap.

At the end rank 0 prints ``soak: N calls, W wrong results, 0 hangs`` (wrong results summed over the ranks) and
the process exits 1 if any result was wrong; before it, the --kinds kinds of call (collective and variant) that
took rank 0 the most time in all, each with its calls, seconds and slowest call, so a setting that runs
slowly shows where its time goes (every call's time includes building and checking its data). On the CPU
backend the defaults are small (40 calls of at most 4 KiB): a smoke test. Settings of the issue: 2 GPUs
(``iris run -n 2``), 4 simulated ranks on one GPU (``IRIS_SIMULATION=1 iris run -n 4``), the shmem heap with
the forced node map (``IRIS_NODE_MAP=0,1``).
"""

import os

# NVLink multicast stays off (CONTRIBUTING.md, "On GPUs"); these must be set before torch is imported.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

import argparse
import math
import random
import threading
import time

import torch
import torch.distributed as dist
from _results import parse_size

import iris
from iris.ccl import Config
from iris.ccl.all_reduce.push import holds

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "all_to_all_v")
VARIANTS = (None, "one_shot", "two_shot", "push", "ll")


def parse_args(gpu: bool) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=10000 if gpu else 40)
    parser.add_argument("--max-bytes", type=parse_size, default=(64 << 20) if gpu else 4096,
                        help="the most bytes of input per rank (64M on GPUs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds one call may take before it is a hang")
    parser.add_argument("--progress", type=int, default=1000, help="a progress line every this many calls")
    parser.add_argument("--kinds", type=int, default=8, help="how many kinds of call the time summary lists")
    return parser.parse_args()


class Watchdog:
    """Names the call in flight and ends the process (exit code 3) when it outlasts ``timeout`` seconds."""

    def __init__(self, rank: int, timeout: float):
        self.rank, self.timeout = rank, timeout
        self.call, self.started = None, None
        threading.Thread(target=self._watch, daemon=True).start()

    def start(self, call: str) -> None:
        self.call, self.started = call, time.monotonic()

    def stop(self) -> None:
        self.started = None

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout / 4))
            started = self.started
            if started is not None and time.monotonic() - started > self.timeout:
                print(f"[rank {self.rank}] HANG: {self.call} did not finish in {self.timeout:.0f} s", flush=True)
                os._exit(3)


def member_input(seed: int, member: int, count: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Member ``member``'s input of one call: quarters within +-4 (their sums are exact in every dtype up to 8
    members), the same on every rank that builds it."""
    g = torch.Generator(device=device).manual_seed(seed * 1009 + member)  # on the device: drawing megabytes
    quarters = torch.randint(-16, 17, (count,), generator=g, device=device)  # on the host took most of a call
    return quarters.to(torch.int32) if dtype == torch.int32 else (quarters / 4).to(dtype)


def draw(rng: random.Random, groups: list, max_bytes: int, call: int) -> dict:
    """One call, drawn alike on every rank."""
    members, group = rng.choice(groups)
    dtype = rng.choice(DTYPES)
    count = max(1, int(math.exp(rng.uniform(0.0, math.log(max(1, max_bytes // dtype.itemsize))))))
    op = rng.choice(COLLECTIVES)
    case = dict(call=call, op=op, dtype=dtype, count=count, members=members, group=group, seed=rng.randrange(1 << 30))
    if op == "all_reduce":
        # the variants whose landing zones hold the message (push, ll: iris.ccl.all_reduce.push.holds)
        case["variant"] = rng.choice([v for v in VARIANTS if v is None or holds(v, count, dtype.itemsize)])
    if op == "broadcast":
        case["root"] = rng.choice(members)
    if op in ("reduce_scatter", "all_to_all"):
        case["count"] = max(1, count // len(members)) * len(members)  # split evenly over the members
    if op == "all_to_all_v":  # row counts from each member to each member, at most its input's rows
        case["splits"] = [[rng.randrange(0, count // len(members) + 1) for _ in members] for _ in members]
    return case


def describe(case: dict) -> str:
    extra = f" variant {case['variant']}" if case.get("variant") else ""
    extra += f" root {case['root']}" if "root" in case else ""
    return (f"call {case['call']}: {case['op']}{extra} of {case['count']} {str(case['dtype'])[6:]} over members "
            f"{list(case['members'])}")


class CallTimes:
    """Seconds spent per kind of call (collective and variant), and each kind's slowest call."""

    def __init__(self):
        self.kinds = {}  # kind -> [calls, seconds, slowest seconds, slowest call]

    def add(self, case: dict, seconds: float) -> None:
        kind = case["op"] + (f" {case['variant']}" if case.get("variant") else "")
        entry = self.kinds.setdefault(kind, [0, 0.0, 0.0, ""])
        entry[0] += 1
        entry[1] += seconds
        if seconds > entry[2]:
            entry[2], entry[3] = seconds, describe(case)

    def summary(self, most: int) -> list:
        """Lines for the ``most`` kinds that took the most time in all."""
        ranked = sorted(self.kinds.items(), key=lambda item: -item[1][1])[:most]
        return [f"soak time: {kind}: {calls} calls, {seconds:.1f} s, slowest {slowest * 1e3:.1f} ms ({which})"
                for kind, (calls, seconds, slowest, which) in ranked]


def run_call(ctx, case: dict, arenas) -> bool:
    """Runs one call on this rank (a member) and checks its result; True if it is right."""
    device = ctx.get_device()
    members, op, dtype, count = case["members"], case["op"], case["dtype"], case["count"]
    me, width = members.index(ctx.get_rank()), len(members)
    inputs = [member_input(case["seed"], m, count, dtype, device) for m in members]
    source, target = (arena[:count * width * dtype.itemsize].view(dtype) for arena in arenas)
    x = source[:count]
    x.copy_(inputs[me])
    group = case["group"]
    if op == "all_reduce":
        out = target[:count]
        ctx.ccl.all_reduce(out, x, group=group, config=Config(all_reduce_variant=case["variant"]))
        want = torch.stack([v.double() for v in inputs]).sum(0).to(dtype)
    elif op == "all_gather":
        out = target[:count * width].view(width, count)
        ctx.ccl.all_gather(out, x.view(1, count), group=group)
        want = torch.stack(inputs)
    elif op == "reduce_scatter":
        part = count // width
        out = target[:part].view(1, part)
        ctx.ccl.reduce_scatter(out, x.view(width, part), group=group)
        want = torch.stack([v.double() for v in inputs]).sum(0).to(dtype)[me * part:(me + 1) * part].view(1, part)
    elif op == "broadcast":
        out = x
        ctx.ccl.broadcast(out, src=case["root"], group=group)
        want = inputs[members.index(case["root"])]
    elif op == "all_to_all":
        part = count // width
        out = target[:count].view(1, count)
        ctx.ccl.all_to_all(out, x.view(1, count), group=group)
        want = torch.cat([v[me * part:(me + 1) * part] for v in inputs]).view(1, count)
    else:  # all_to_all_v: member i sends splits[i][j] elements to member j, packed in member order
        splits = case["splits"]
        received = [splits[i][me] for i in range(width)]
        out = target[:max(1, sum(received))]
        counts = torch.tensor(splits[me], dtype=torch.int64, device=device)
        ctx.ccl.all_to_all_v(out, x, counts, group=group)
        want = torch.cat([v[sum(splits[i][:me]):sum(splits[i][:me + 1])] for i, v in enumerate(inputs)])
        out = out[:want.numel()]
    ctx.backend.synchronize(device)
    return torch.equal(out.view(want.shape), want)


def main() -> int:
    gpu = torch.cuda.is_available() and os.environ.get("IRIS_BACKEND", "") != "cpu"
    args = parse_args(gpu)
    most_ranks = int(os.environ.get("WORLD_SIZE", "8"))
    ctx = iris.iris(2 * (args.max_bytes * most_ranks + 256) + (16 << 20))  # the two arenas, and room to spare
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    arenas = [ctx.empty(args.max_bytes * world + 256, dtype=torch.uint8) for _ in range(2)]  # inputs, outputs
    # the groups: every rank, and from 3 ranks each run of consecutive ranks of 2 or more that leaves one out
    groups = [(tuple(range(world)), None)]
    for size in range(2, world):
        for first in range(world - size + 1):
            members = tuple(range(first, first + size))
            groups.append((members, dist.new_group(list(members))))
    rng = random.Random(args.seed)
    watchdog = Watchdog(rank, args.timeout)
    times = CallTimes()
    wrong, begun = 0, time.monotonic()
    for call in range(args.calls):
        case = draw(rng, groups, args.max_bytes, call)
        if rank in case["members"]:
            watchdog.start(describe(case))
            started = time.monotonic()
            if not run_call(ctx, case, arenas):
                wrong += 1
                print(f"[rank {rank}] WRONG: {describe(case)}", flush=True)
            times.add(case, time.monotonic() - started)
            watchdog.stop()
        if rank == 0 and args.progress and (call + 1) % args.progress == 0:
            print(f"soak: {call + 1} of {args.calls} calls, {time.monotonic() - begun:.0f} s", flush=True)
    watchdog.start(f"the final count after call {args.calls - 1}")
    total = torch.tensor([wrong], dtype=torch.int64, device=ctx.get_device() if dist.get_backend() == "nccl"
                         else "cpu")
    dist.all_reduce(total)
    watchdog.stop()
    if rank == 0:
        for line in times.summary(args.kinds):
            print(line, flush=True)
        print(f"soak: {args.calls} calls, {int(total)} wrong results, 0 hangs ({world} ranks, "
              f"{ctx.backend.name} backend, seed {args.seed}, up to {args.max_bytes} bytes per rank)", flush=True)
    ctx.barrier()
    ctx.close()
    return 1 if int(total) else 0


if __name__ == "__main__":
    raise SystemExit(main())
