"""`pip install` of the kvcache module leaves the source tree as it found it.

Run by CTest as `python.pip_install` (label `pip`; a full CMake build of the
module, a few minutes on 2 cores):
  1. copies the files git would commit (tracked, and untracked but not
     ignored) into a temporary folder and commits them there, so the copy's
     `git status --porcelain --ignored` starts empty;
  2. makes a venv with the system's site packages (Debian's NumPy) and runs
     `pip install --no-index --no-deps -v COPY` in it, with the default build
     directory (the backend's temporary one) and its bytecode left on;
  3. checks that pip printed CMake's progress, that the installed module
     imports from outside the tree and has its stubs, and, where mypy is
     installed, that mypy type-checks against those installed stubs;
  4. checks that the copy's `git status --porcelain --ignored` is still empty
     and that the temporary build directory is gone.
Exits 77 (CTest: skipped) without git or a working venv.
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP = 77
MYPY_EXAMPLE = """\
import kvcache
pool = kvcache.ThreadPool(1)
threads: int = pool.num_threads
wrong: str = pool.num_threads
"""


def run(cmd, **kwargs):
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run(cmd, check=True, **kwargs)


def copy_sources(dest):
    """The files git would commit, copied into dest and committed there."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], check=True, capture_output=True).stdout
    for rel in filter(None, listed.decode().split("\0")):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    git = ["git", "-C", str(dest), "-c", "user.name=check", "-c", "user.email=check@localhost"]
    run(git[:3] + ["init", "-q"])
    run(git + ["add", "-A"])
    run(git + ["commit", "-q", "-m", "copy"])


def tree_state(src):
    return subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--ignored",
                           "--untracked-files=all"], check=True, capture_output=True,
                          text=True).stdout


def clean_env(work):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "KVCACHE_BUILD_DIR",
                        "PIP_CONFIG_FILE", "PYTHONDEVMODE")}
    env["TMPDIR"] = str(work / "tmp")  # where the backend's temporary build directory goes
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    if shutil.which("ccache"):  # a rerun compiles from the cache
        env["CMAKE_ARGS"] = "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
        env["CCACHE_BASEDIR"] = str(work)
    return env


def pip_install(python, src, env):
    """pip install -v, its output passed through and returned."""
    cmd = [str(python), "-m", "pip", "install", "--no-index", "--no-deps", "-v", str(src)]
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, stdin=subprocess.DEVNULL)
    lines = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    if proc.wait() != 0:
        raise SystemExit(f"FAIL: pip install exited {proc.returncode}")
    return "".join(lines)


def check_installed(python, work, env):
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('platlib'))"],
                          check=True, capture_output=True, text=True, env=env).stdout.strip()
    site = Path(site)
    for name in ("kvcache.pyi", "kvcache-stubs/__init__.pyi", "kvcache-stubs/py.typed"):
        assert (site / name).is_file(), f"{name} not installed into {site}"
    shown = subprocess.run([str(python), "-c", "import kvcache; print(kvcache.__file__)"],
                           check=True, capture_output=True, text=True, env=env, cwd=work).stdout
    assert Path(shown.strip()).parent == site, f"imported {shown.strip()}, not from {site}"
    if subprocess.run([sys.executable, "-c", "import mypy"], capture_output=True).returncode:
        print("mypy not installed: installed stubs not type-checked")
        return
    example = work / "example.py"
    example.write_text(MYPY_EXAMPLE)
    out = subprocess.run([sys.executable, "-m", "mypy", "--python-executable", str(python),
                          "--cache-dir", str(work / "mypy-cache"), "--no-error-summary",
                          str(example)], capture_output=True, text=True, env=env, cwd=work).stdout
    print(out)
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "example.py:4:" in errors[0] and '"int"' in errors[0], (
        "mypy should read the installed stubs and find exactly the str/int mismatch of line 4")


def main():
    if not shutil.which("git"):
        print("SKIP: git is not installed")
        return SKIP
    with tempfile.TemporaryDirectory(prefix="kvcache-pip-check-") as tmp:
        work = Path(tmp)
        src = work / "src"
        (work / "tmp").mkdir()
        copy_sources(src)
        before = tree_state(src)
        assert before == "", f"the fresh copy is not clean:\n{before}"
        env = clean_env(work)
        venv = work / "venv"
        made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                              env=env, capture_output=True, text=True)
        if made.returncode != 0:
            print(f"SKIP: no venv (python3-venv): {made.stderr.strip()}")
            return SKIP
        python = venv / "bin" / "python"
        output = pip_install(python, src, env)
        assert "kvcache: building the Python module in" in output, "no build banner in pip -v"
        assert "Linking CXX shared module" in output, "CMake's progress did not reach pip -v"
        check_installed(python, work, env)
        after = tree_state(src)
        assert after == "", f"pip install wrote into the source tree:\n{after}"
        left = sorted(p.name for p in (work / "tmp").iterdir())
        assert not any(n.startswith("kvcache-pip-") for n in left), f"build dir left: {left}"
    print("pip install left the source tree unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
