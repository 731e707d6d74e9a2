"""The heap's reserved tail: its layout is pinned (every rank's kernels reach a region by its offset, so a
change of layout is a change on the device), and each collective declares its own regions."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import iris  # noqa: F401  (importing iris imports iris.ccl, whose modules declare their regions)
from iris.host.team import reserved_layout
from iris.memory import reserved

ROOT = Path(__file__).resolve().parent.parent
I64, I32 = torch.int64, torch.int32
ENGINE = [("engine.staging", 262144, I64), ("engine.staging_locks", 256, I32)]


def _regions(world: int, engine: bool) -> list[tuple[str, int, torch.dtype]]:
    """Each region (name, elements, dtype) in tail order, as the layout was before the collectives declared them."""
    return [("barrier.arrivals", 128 * world, I64), ("ccl.locks", 4096, I32), ("ccl.ring_flags", 128, I64),
            ("ccl.push_landing", 262144 * world, I64), ("ccl.push_flags", 256 * world, I32),
            ("ccl.ll_landing", 262144 * world, I64), ("ccl.p2p_mail", 4 * world, I64),
            ("ccl.a2av_table", 2 * world, I64), *(ENGINE if engine else []), ("engine.scratch", 2, I64)]


# (world, engine path): (the tail's bytes, each region's offset in tail order), as computed before the move
PINNED = {
    (1, False): (4213824, (0, 1024, 17408, 18432, 2115584, 2116608, 4213760, 4213792, 4213808)),
    (1, True): (6312000, (0, 1024, 17408, 18432, 2115584, 2116608, 4213760, 4213792, 4213808, 6310960, 6311984)),
    (2, False): (8410224, (0, 2048, 18432, 19456, 4213760, 4215808, 8410112, 8410176, 8410208)),
    (2, True): (10508400, (0, 2048, 18432, 19456, 4213760, 4215808, 8410112, 8410176, 8410208, 10507360,
                           10508384)),
    (3, False): (12606624, (0, 3072, 19456, 20480, 6311936, 6315008, 12606464, 12606560, 12606608)),
    (8, False): (33588624, (0, 8192, 24576, 25600, 16802816, 16811008, 33588224, 33588480, 33588608)),
    (8, True): (35686800, (0, 8192, 24576, 25600, 16802816, 16811008, 33588224, 33588480, 33588608, 35685760,
                           35686784)),
}


@pytest.mark.parametrize("world,engine", sorted(PINNED))
def test_the_reserved_layout_is_pinned(world, engine):
    layout = reserved_layout(world, engine_path=engine)
    nbytes, offsets = PINNED[(world, engine)]
    regions = _regions(world, engine)
    assert [layout.place(name) for name, _, _ in regions] == [
        (offset, count, dtype) for offset, (_, count, dtype) in zip(offsets, regions)]
    assert layout.nbytes == nbytes
    assert sorted(layout.names()) == sorted(name for name, _, _ in regions)


# Each collective's regions, declared in its own module: (module, name, elements for a team of W, dtype, on the heap)
OWNERS = {
    "iris/ccl/all_reduce/spinlock.py": [("ccl.locks", lambda w: 4096, I32, True)],
    "iris/ccl/all_reduce/ring.py": [("ccl.ring_flags", lambda w: 128, I64, True),
                                    ("ccl.ring_counts", lambda w: 128, I64, False)],
    "iris/ccl/all_reduce/push.py": [("ccl.push_landing", lambda w: 262144 * w, I64, True),
                                    ("ccl.push_flags", lambda w: 256 * w, I32, True),
                                    ("ccl.ll_landing", lambda w: 262144 * w, I64, True),
                                    ("ccl.push_counts", lambda w: 256 * w, I32, False),
                                    ("ccl.ll_counts", lambda w: 256 * w, I32, False)],
    "iris/ccl/p2p.py": [("ccl.p2p_mail", lambda w: 4 * w, I64, True), ("ccl.p2p_sent", lambda w: w, I64, False),
                        ("ccl.p2p_received", lambda w: w, I64, False), ("ccl.p2p_finished", lambda w: w, I32, False)],
    "iris/ccl/all_to_all.py": [("ccl.a2av_table", lambda w: 2 * w, I64, True)],
}
NOT_ZEROED = {"ccl.push_landing", "ccl.a2av_table"}  # written by a call before it reads them


def _declared_names(path: Path) -> list[str]:
    """The names of the Region(...) calls in a module's source."""
    tree = ast.parse(path.read_text())
    return [node.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "Region" and node.args and isinstance(node.args[0], ast.Constant)]


def test_each_collective_declares_its_regions_in_its_own_module():
    declared = {region.name: region for region in reserved.declared()}
    assert sorted(declared) == sorted(name for regions in OWNERS.values() for name, *_ in regions)
    everywhere = {path: _declared_names(path) for path in (ROOT / "iris").rglob("*.py")}
    for module, regions in OWNERS.items():
        assert sorted(everywhere.pop(ROOT / module)) == sorted(name for name, *_ in regions), module
        for name, elements, dtype, on_heap in regions:
            region = declared[name]
            assert (region.elements(3), region.dtype, region.on_heap) == (elements(3), dtype, on_heap), name
            assert region.zeroed == (name not in NOT_ZEROED), name
    assert not any(everywhere.values()), {path: names for path, names in everywhere.items() if names}


def test_the_team_knows_no_collective():
    """team.py knows ranks, members, nodes and the device barrier: no collective's constant, region or import."""
    tree = ast.parse((ROOT / "iris/host/team.py").read_text())
    imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not [name for name in imported if name.startswith("iris.ccl")], imported
    for node in ast.walk(tree):  # the code without its docstrings (which may show a region's name as an example)
        body = getattr(node, "body", None)
        first = body[0] if body and isinstance(body, list) else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            body.pop(0)
    found = re.findall(r"\b(?:LOCK_WORDS|PUSH_\w+|LL_\w+|P2P_\w+|lock_words|(?:ring|push|ll|p2p|a2av)_\w+|ccl\.\w+)",
                       ast.unparse(tree))
    assert found == [], found
    defined = {target.id for node in tree.body if isinstance(node, ast.Assign) for target in node.targets
               if isinstance(target, ast.Name)}
    assert defined == set(), defined


def test_a_region_declared_twice_differently_is_refused():
    region = reserved.declared()[0]
    assert reserved.declare(region) == (region,)  # the same again: nothing changes
    with pytest.raises(ValueError, match="declared twice"):
        reserved.declare(reserved.Region(region.name, region.count + 1, region.dtype, order=region.order))
    with pytest.raises(ValueError, match="lifetime"):
        reserved.Region("x", 1, I32, lifetime="forever")


def _team_regions():
    ctx = iris.iris(1 << 20)
    team, heap, world = ctx.team, ctx.team.heap, ctx.get_num_ranks()
    seen = {}
    for region in reserved.declared():
        tensor = team.region(region.name)
        place = None
        if region.on_heap:
            place = tensor.data_ptr() - heap.base - heap.size
            assert heap.contains(tensor), region.name
        else:
            assert not heap.contains(tensor), region.name
        zero = bool((tensor == 0).all()) if region.zeroed else None
        seen[region.name] = (tensor.numel(), tensor.dtype, place, zero)
    ctx.close()
    return world, seen


def test_the_team_looks_each_region_up_by_name_where_the_layout_put_it(ranks):
    for world, seen in ranks.run(_team_regions):
        layout = reserved_layout(world)
        for module, regions in OWNERS.items():
            for name, elements, dtype, on_heap in regions:
                place = layout.place(name)[0] if on_heap else None
                assert seen[name] == (elements(world), dtype, place, None if name in NOT_ZEROED else True), name


def test_every_context_lays_out_the_collectives_regions_whatever_the_program_imported():
    """The regions are declared when iris.ccl is imported; a context made by a program that imports only the
    context's module must lay out the same tail as every other rank's (importing iris imports iris.ccl)."""
    code = ("import iris.context; from iris.memory import reserved; "
            "print(sorted(r.name for r in reserved.declared()))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == repr(sorted(region.name for region in reserved.declared()))
