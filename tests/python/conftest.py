"""pytest setup for the kvcache Python tests.

CTest runs these with PYTHONPATH pointing at the built module (build/python).
Run by hand from the repository root with:
    PYTHONPATH=build/python /usr/bin/python3 -m pytest tests/python -q
As a convenience, build/python is tried when kvcache is not importable.
"""
import os
import sys

try:
    import kvcache  # noqa: F401
except ImportError:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "build", "python"))
    import kvcache  # noqa: F401
