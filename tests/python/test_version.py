"""kvcache.__version__: the library's version (kvcache::version()), taken from
project(kvcache VERSION ...) in the top-level CMakeLists.txt, its one source."""
import os
import re

import kvcache

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        return re.search(r"project\(kvcache VERSION ([0-9.]+)", f.read()).group(1)


def test_version_is_the_projects():
    assert isinstance(kvcache.__version__, str)
    assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", kvcache.__version__)
    assert kvcache.__version__ == project_version()
