"""Every public name exists and says what it does."""

import iris


def test_every_public_name_exists_and_is_documented():
    undocumented = []
    for name in iris.__all__:
        obj = getattr(iris, name)  # AttributeError names a missing export
        if isinstance(obj, int):  # log levels
            continue
        doc = getattr(obj, "__doc__", None) or getattr(getattr(obj, "fn", None), "__doc__", None)
        if not doc or len(doc.strip()) < 20:
            undocumented.append(name)
    assert not undocumented, f"public names without a docstring: {undocumented}"
