"""What each of several calls that should be refused says: for tests of argument checking."""


def refusals(calls) -> list[str]:
    """The TypeError or ValueError message each call raised, or "no error".

    Example:
        >>> refusals([lambda: int("x"), lambda: 1])
        ["invalid literal for int() with base 10: 'x'", 'no error']
    """
    messages = []
    for call in calls:
        try:
            call()
            messages.append("no error")
        except (TypeError, ValueError) as exc:
            messages.append(str(exc))
    return messages
