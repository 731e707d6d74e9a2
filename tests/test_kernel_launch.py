"""iris.host.replay's call keys: what makes a repeated call the same call (its remembered launches are
relaunched as they are), on plain tensors, without ranks."""

import gc

import torch

from iris.host.replay import call_key, weakly_held


def test_a_call_key_tells_apart_what_the_launches_depend_on():
    x = torch.zeros(8, 8)
    same = call_key("op", x, x, 1)
    assert call_key("op", x, x, 1) == same and hash(call_key("op", x, x, 1)) == hash(same)
    different = [
        call_key("other", x, x, 1),  # another call
        call_key("op", x, x, 2),  # another argument
        call_key("op", x.t(), x, 1),  # the same memory and shape, other strides
        call_key("op", x, x.t(), 1),
        call_key("op", x.view(torch.int32), x, 1),  # the same memory, layout and shape, another dtype
        call_key("op", x[1:], x, 1),  # another address and shape
        call_key("op", x.view(4, 16), x, 1),  # another shape
        call_key("op", x[:, ::2], x, 1),  # a strided view
        call_key("op", x, None, 1),  # one tensor
    ]
    assert len(set(different + [same])) == len(different) + 1


def test_a_call_key_follows_a_tensor_changed_in_place():
    x, y = torch.zeros(4, 4), torch.zeros(4, 4)
    before = call_key("op", x, y)
    x.t_()  # the same object, other strides
    assert call_key("op", x, y) != before
    x.t_()
    assert call_key("op", x, y) == before
    y.resize_(16)  # the same object, another shape
    assert call_key("op", x, y) != before


def test_a_call_key_is_none_for_anything_but_plain_tensors():
    x = torch.zeros(4)

    class Sub(torch.Tensor):
        pass

    assert call_key("op", x.numpy(), x) is None
    assert call_key("op", x, [1, 2]) is None
    assert call_key("op", x.as_subclass(Sub), x) is None
    assert call_key("op", x, x.as_subclass(Sub)) is None


def test_a_weakly_held_launch_runs_on_its_tensors_and_keeps_none_alive():
    x, out = torch.zeros(4), torch.zeros(4)
    launch = weakly_held(lambda a, bias, b: b.copy_(a + 1), x, None, out)
    launch()
    assert out.eq(1).all() and len(launch.tensors) == 2  # None is no tensor
    del x
    gc.collect()
    assert launch.tensors[0]() is None and launch.tensors[1]() is out
