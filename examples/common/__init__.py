"""What the numbered examples share: starting the ranks, datatypes, patterns to check, result tables.

An example imports it after putting ``examples/`` on its path::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from common import utils
"""
