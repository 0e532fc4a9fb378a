"""`pip install .` for the kvcache Python module, offline, with Debian packages only.

There is deliberately no pyproject.toml: scikit-build-core is not packaged for
Debian 12, and a PEP 517 build would make pip fetch setuptools from PyPI into an
isolated environment. Without one, pip runs this file with the system's
setuptools (python3-setuptools) and it simply drives the project's CMake build
for the one target `kvcache_py`, then copies the extension where setuptools
expects it. Requires what `make deps` installs.

    /usr/bin/python3 -m pip install .                 # in a venv, or
    /usr/bin/python3 -m pip install --break-system-packages .   # Debian's PEP 668 guard
    /usr/bin/python3 -m pip install --target DIR .     # anywhere you like

The supported alternative is `cmake --install build` (see docs/python.md).
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def project_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(kvcache VERSION ([0-9.]+)", text).group(1)


class CMakeExtension(Extension):
    """An extension whose sources CMake builds."""

    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures the CMake project in build_temp, builds kvcache_py, copies it."""

    def build_extension(self, ext):
        build_dir = Path(self.build_temp).resolve() / "cmake"
        configure = ["cmake", "-S", str(ROOT), "-B", str(build_dir),
                     "-DCMAKE_BUILD_TYPE=Release", "-DKVCACHE_PYTHON=ON",
                     # the module alone: no tests, tools, bench or engine to configure
                     "-DKVCACHE_BUILD_TESTS=OFF", "-DKVCACHE_BUILD_TOOLS=OFF",
                     "-DKVCACHE_BUILD_BENCH=OFF", "-DKVCACHE_BUILD_ENGINE=OFF",
                     "-DKVCACHE_INSTALL=OFF", "-DKVCACHE_BUILD_C_SHARED=OFF",
                     f"-DPython3_EXECUTABLE={sys.executable}"]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        subprocess.run(configure, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "kvcache_py",
                        "-j", jobs], check=True)
        built = sorted((build_dir / "python").glob("kvcache*.so"))
        if not built:
            raise RuntimeError(f"CMake built no kvcache*.so in {build_dir / 'python'}")
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[0], target)


setup(
    name="kvcache",
    version=project_version(),
    description="KV cache for LLM inference (C++20 core, NumPy views)",
    ext_modules=[CMakeExtension("kvcache")],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": "build-pip"}},
    python_requires=">=3.9",
    install_requires=["numpy"],
    zip_safe=False,
)
