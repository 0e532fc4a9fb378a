"""The `pip install .` build backend (tools/pip/kvcache_build.py) without a
CMake build: where it builds (a temporary directory unless -C build-dir= or
KVCACHE_BUILD_DIR says otherwise), that a wheel build writes nothing into the
source tree and removes its temporary directory, the wheel it packs, and that
importing it leaves no bytecode behind. python.pip_install (CTest, label pip)
runs the real `pip install` from a copy of the sources."""
import base64
import csv
import hashlib
import importlib.util
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BACKEND = ROOT / "tools" / "pip" / "kvcache_build.py"


@pytest.fixture(scope="module")
def backend():
    spec = importlib.util.spec_from_file_location("kvcache_build", BACKEND)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pyproject_names_this_backend_and_requires_nothing():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'build-backend = "kvcache_build"' in text
    assert 'backend-path = ["tools/pip"]' in text and "requires = []" in text
    assert not (ROOT / "setup.py").exists()


def test_build_dir_is_temporary_unless_one_is_given(backend, tmp_path):
    assert backend.build_dir_setting({}, environ={}) is None
    assert backend.build_dir_setting(None, environ={"KVCACHE_BUILD_DIR": ""}) is None
    env = {"KVCACHE_BUILD_DIR": str(tmp_path / "env")}
    assert backend.build_dir_setting({}, environ=env) == tmp_path / "env"
    given = {"build-dir": str(tmp_path / "setting")}
    assert backend.build_dir_setting(given, environ=env) == tmp_path / "setting"  # wins
    relative = backend.build_dir_setting({"build-dir": "b"}, environ={})
    assert relative.is_absolute() and relative == Path.cwd() / "b"
    with pytest.raises(ValueError, match="one path"):
        backend.build_dir_setting({"build-dir": ["a", "b"]}, environ={})


def test_cmake_arguments(backend, tmp_path):
    assert backend.extra_cmake_args({}, environ={}) == []
    args = backend.extra_cmake_args({"cmake-args": "-DB=2 '-DC=x y'"},
                                    environ={"CMAKE_ARGS": "-DA=1"})
    assert args == ["-DA=1", "-DB=2", "-DC=x y"]
    cmd = backend.configure_command(tmp_path / "b", ["-DX=1"])
    assert cmd[:5] == ["cmake", "-S", str(ROOT), "-B", str(tmp_path / "b")]
    assert f"-DPython3_EXECUTABLE={sys.executable}" in cmd and cmd[-1] == "-DX=1"
    assert "-DKVCACHE_BUILD_TESTS=OFF" in cmd and "-DKVCACHE_PYTHON_INSTALL_DIR=." in cmd


def fake_build(calls):
    """A build_module that records where it was asked to build and stages
    what the CMake install would."""
    def build_module(build_dir, staging, config_settings=None):
        calls.append(Path(build_dir))
        Path(build_dir).mkdir(parents=True, exist_ok=True)
        (Path(build_dir) / "CMakeCache.txt").write_text("")
        stubs = Path(staging) / "kvcache-stubs"
        stubs.mkdir(parents=True)
        (Path(staging) / "kvcache.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
        (Path(staging) / "kvcache.pyi").write_text("x: int\n")
        (stubs / "__init__.pyi").write_text("x: int\n")
        (stubs / "py.typed").write_text("")
    return build_module


def tree_state():
    return subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--ignored",
                           "--untracked-files=all", "--", "."], capture_output=True,
                          text=True).stdout


def test_a_wheel_build_writes_nothing_into_the_source_tree(backend, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(backend, "build_module", fake_build(calls))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.delenv("KVCACHE_BUILD_DIR", raising=False)
    (tmp_path / "tmp").mkdir()
    (tmp_path / "wheels").mkdir()
    before = tree_state()
    name = backend.build_wheel(str(tmp_path / "wheels"))
    assert tree_state() == before
    assert calls[0].parent.name.startswith("kvcache-pip-")  # the temporary directory ...
    assert calls[0].parent.parent == tmp_path / "tmp"
    assert not calls[0].exists()                             # ... removed afterwards
    assert (tmp_path / "wheels" / name).is_file()
    backend.build_wheel(str(tmp_path / "wheels"), {"build-dir": str(tmp_path / "kept")})
    assert calls[1] == tmp_path / "kept" and (tmp_path / "kept" / "CMakeCache.txt").exists()


def test_the_wheel_holds_module_stubs_and_a_valid_record(backend, tmp_path, monkeypatch):
    monkeypatch.setattr(backend, "build_module", fake_build([]))
    name = backend.build_wheel(str(tmp_path), {"build-dir": str(tmp_path / "b")})
    version = backend.project_version()
    assert name == f"kvcache-{version}-{backend.wheel_tag()}.whl"
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert backend.wheel_tag().startswith(f"{py}-{py}-")
    with zipfile.ZipFile(tmp_path / name) as whl:
        names = set(whl.namelist())
        info = f"kvcache-{version}.dist-info"
        assert {"kvcache.pyi", "kvcache-stubs/__init__.pyi", "kvcache-stubs/py.typed",
                f"{info}/METADATA", f"{info}/WHEEL", f"{info}/RECORD"} <= names
        metadata = whl.read(f"{info}/METADATA").decode()
        assert f"Version: {version}" in metadata and "Requires-Dist: numpy" in metadata
        rows = list(csv.reader(io.StringIO(whl.read(f"{info}/RECORD").decode())))
        assert {r[0] for r in rows} == names
        for path, digest, size in rows:
            if path.endswith("RECORD"):
                continue
            data = whl.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == f"sha256={expected.decode()}" and int(size) == len(data)


def test_metadata_hook_matches_the_wheel(backend, tmp_path):
    info = backend.prepare_metadata_for_build_wheel(str(tmp_path))
    assert info == f"kvcache-{backend.project_version()}.dist-info"
    assert (tmp_path / info / "METADATA").read_text().startswith("Metadata-Version: 2.1")
    assert backend.get_requires_for_build_wheel() == []


def test_importing_the_backend_leaves_no_bytecode(tmp_path):
    copy = tmp_path / "tools" / "pip"
    copy.mkdir(parents=True)
    (copy / "kvcache_build.py").write_text(BACKEND.read_text())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-c", "import kvcache_build"], cwd=copy, env=env,
                   check=True)
    assert sorted(p.name for p in copy.iterdir()) == ["kvcache_build.py"]
