"""PEP 517 build backend for `pip install .`: builds the kvcache Python module
with the project's CMake, outside the source tree, and packs it as a wheel.

Why a backend of its own: scikit-build-core is not packaged for Debian 12, and
setuptools (the fallback without pyproject.toml) writes `build/`-style folders
and `*.egg-info` into the source tree. This file needs nothing but the Python
standard library, so pyproject.toml requires nothing and pip's isolated build
environment is made without the network.

Where CMake builds (`build_dir_setting`):
  * `pip install -C build-dir=PATH .` (pip's --config-settings), else
  * the environment variable KVCACHE_BUILD_DIR, else
  * a temporary directory, removed when the wheel is built.
A kept build directory makes the next `pip install` incremental. Extra CMake
arguments: `-C cmake-args="..."` or the environment variable CMAKE_ARGS (both
split like a shell line). Parallel jobs: CMAKE_BUILD_PARALLEL_LEVEL (default:
all cores).

Progress: CMake's and Ninja's output is passed through line by line as it
comes; pip shows it with `pip install -v .` (without -v pip shows a spinner and
prints the output only if the build fails).

Nothing is written into the source tree: the build directory and the wheel's
staging folder are elsewhere, and the one file Python writes by itself, this
module's bytecode in tools/pip/__pycache__/, is removed again on import
(`_forget_own_bytecode`).
"""
import base64
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = "kvcache"
SUMMARY = "KV cache for LLM inference (C++20 core, NumPy views)"


def _forget_own_bytecode():
    """Removes the bytecode that importing this file just wrote into the
    source tree (tools/pip/__pycache__/kvcache_build.*.pyc), and the folder if
    that leaves it empty: a build must leave the tree as it found it."""
    cached = globals().get("__cached__")
    if not cached or not Path(cached).is_file():
        return
    try:
        Path(cached).unlink()
        Path(cached).parent.rmdir()  # only if empty
    except OSError:
        pass


_forget_own_bytecode()


# ---- what to build, and where ---------------------------------------------------------


def project_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(kvcache VERSION ([0-9.]+)", text).group(1)


def build_dir_setting(config_settings=None, environ=None):
    """The build directory the user asked for (config setting `build-dir`,
    then KVCACHE_BUILD_DIR), as an absolute Path; None means a temporary one."""
    environ = os.environ if environ is None else environ
    value = (config_settings or {}).get("build-dir") or environ.get("KVCACHE_BUILD_DIR")
    if not value:
        return None
    if not isinstance(value, str):
        raise ValueError(f"build-dir must be one path, got {value!r}")
    return Path(value).expanduser().resolve()


def extra_cmake_args(config_settings=None, environ=None):
    """CMAKE_ARGS, then the `cmake-args` config setting, split like a shell line."""
    environ = os.environ if environ is None else environ
    args = shlex.split(environ.get("CMAKE_ARGS", ""))
    setting = (config_settings or {}).get("cmake-args", "")
    for value in [setting] if isinstance(setting, str) else setting:
        args += shlex.split(value)
    return args


def configure_command(build_dir, extra=()):
    """CMake configure for the module alone: no tests, tools, bench or engine."""
    command = ["cmake", "-S", str(ROOT), "-B", str(build_dir),
               "-DCMAKE_BUILD_TYPE=Release", "-DKVCACHE_PYTHON=ON",
               "-DKVCACHE_BUILD_TESTS=OFF", "-DKVCACHE_BUILD_TOOLS=OFF",
               "-DKVCACHE_BUILD_BENCH=OFF", "-DKVCACHE_BUILD_ENGINE=OFF",
               "-DKVCACHE_INSTALL=OFF", "-DKVCACHE_BUILD_C_SHARED=OFF",
               f"-DPython3_EXECUTABLE={sys.executable}",
               "-DKVCACHE_PYTHON_INSTALL_DIR=."]
    if shutil.which("ninja") and not (Path(build_dir) / "CMakeCache.txt").exists():
        command += ["-G", "Ninja"]
    return command + list(extra)


def _run(command):
    """Runs a command, its output passed through as it comes (pip -v shows it)."""
    print("kvcache:", shlex.join(command), flush=True)
    subprocess.run(command, check=True, stdin=subprocess.DEVNULL)


def build_module(build_dir, staging, config_settings=None):
    """Configures and builds kvcache_py in build_dir, then installs the
    `python` component (module, stubs) into staging."""
    print(f"kvcache: building the Python module in {build_dir}", flush=True)
    _run(configure_command(build_dir, extra_cmake_args(config_settings)))
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    _run(["cmake", "--build", str(build_dir), "--target", "kvcache_py", "-j", jobs])
    _run(["cmake", "--install", str(build_dir), "--component", "python",
          "--prefix", str(staging)])
    if not list(Path(staging).glob("kvcache*.so")) and not list(Path(staging).glob("kvcache*.pyd")):
        raise RuntimeError(f"the CMake install put no kvcache module into {staging}")


# ---- wheel ----------------------------------------------------------------------------------


def wheel_tag():
    impl = sys.implementation.name
    if impl != "cpython":
        raise RuntimeError(f"kvcache's wheel is built for CPython, not {impl}")
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{py}-{py}-{plat}"


def _dist_info():
    return f"{NAME}-{project_version()}.dist-info"


def _metadata():
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {project_version()}\n"
            f"Summary: {SUMMARY}\nRequires-Python: >=3.9\n"
            "Requires-Dist: numpy\n")


def _wheel_file():
    return (f"Wheel-Version: 1.0\nGenerator: kvcache_build\nRoot-Is-Purelib: false\n"
            f"Tag: {wheel_tag()}\n")


def _write_dist_info(directory):
    info = Path(directory) / _dist_info()
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(_metadata())
    (info / "WHEEL").write_text(_wheel_file())
    (info / "top_level.txt").write_text(f"{NAME}\n")
    return info


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def pack_wheel(staging, wheel_directory):
    """Zips staging (module files + dist-info) into a wheel with its RECORD."""
    staging = Path(staging)
    info = _write_dist_info(staging)
    wheel_name = f"{NAME}-{project_version()}-{wheel_tag()}.whl"
    record_name = f"{info.name}/RECORD"
    record = ""
    with zipfile.ZipFile(Path(wheel_directory) / wheel_name, "w", zipfile.ZIP_DEFLATED) as whl:
        for path in sorted(p for p in staging.rglob("*") if p.is_file()):
            name = path.relative_to(staging).as_posix()
            data = path.read_bytes()
            whl.writestr(zipfile.ZipInfo.from_file(path, name), data, zipfile.ZIP_DEFLATED)
            record += _record_line(name, data)
        whl.writestr(record_name, record + f"{record_name},,\n")
    return wheel_name


# ---- the PEP 517 hooks ---------------------------------------------------------------------


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _write_dist_info(metadata_directory).name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    chosen = build_dir_setting(config_settings)
    with tempfile.TemporaryDirectory(prefix="kvcache-pip-") as scratch:
        build_dir = chosen or Path(scratch) / "build"
        staging = Path(scratch) / "wheel"
        build_module(build_dir, staging, config_settings)
        return pack_wheel(staging, wheel_directory)


def _sdist_files():
    """The tracked files (git ls-files), or, outside a git checkout, every file
    but build folders, caches and VCS data."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], check=True,
                             capture_output=True).stdout
        return [f for f in out.decode().split("\0") if f and (ROOT / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = re.compile(r"(^|/)(build[^/]*|\.git|__pycache__|[^/]*\.egg-info)(/|$)")
        return [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
                if p.is_file() and not skip.search(p.relative_to(ROOT).as_posix())]


def build_sdist(sdist_directory, config_settings=None):
    base = f"{NAME}-{project_version()}"
    name = f"{base}.tar.gz"
    with tarfile.open(Path(sdist_directory) / name, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(_sdist_files()):
            tar.add(ROOT / rel, arcname=f"{base}/{rel}", recursive=False)
        with tempfile.TemporaryDirectory(prefix="kvcache-sdist-") as scratch:
            pkg_info = Path(scratch) / "PKG-INFO"
            pkg_info.write_text(_metadata())
            tar.add(pkg_info, arcname=f"{base}/PKG-INFO")
    return name
