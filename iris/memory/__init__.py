"""The symmetric heap (``heap.py``: SymmetricHeap, a bump allocator) and its torch-like tensor factories."""
