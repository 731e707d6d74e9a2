"""Names and behaviours of the original Iris's API that code written for it relies on (issue 19).

Each check runs where that code runs: in every rank of a job, through ``import iris`` alone.
The device-side argument orders of load and get are in tests/test_device_api.py; debug mode's
cross-rank check of collectives in tests/test_debug.py.
"""

import torch

import iris


def _host_names_on_rank():
    ctx = iris.iris(1 << 20)
    flat = ctx.allocate(10, torch.int32)
    nested = ctx.zeros(((2, 3, 4),))  # the original unwraps a size nested at any depth
    empties = [ctx.zeros(0), ctx.empty((2, 0)), ctx.zeros(4)[:0]]
    found = dict(
        allocate=(tuple(flat.shape), flat.dtype, ctx.is_symmetric(flat)),
        nested=tuple(nested.shape),
        empty_on_heap=[ctx.is_symmetric(t) for t in empties],
        empty_elsewhere=ctx.is_symmetric(torch.zeros(0, device=ctx.get_device())),
    )
    ctx.close()
    return found


def test_host_names_of_the_original(ranks):
    for found in ranks.run(_host_names_on_rank):
        assert found["allocate"] == ((10,), torch.int32, True)
        assert found["nested"] == (2, 3, 4)
        assert found["empty_on_heap"] == [True, True, True]  # an empty tensor made by the heap is on it
        assert found["empty_elsewhere"] is False


def test_triton_context_is_the_device_context():
    assert iris.TritonContext is iris.DeviceContext
