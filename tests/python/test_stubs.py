"""python/kvcache.pyi against the module it describes, so the stubs cannot rot:
every public name of the module (and of each class) has a stub entry and every
stub entry a runtime name; each function's and method's parameters (names,
order, keyword-only, which have defaults) equal the runtime signature, read
from pybind11's docstring (several when it is overloaded) or from
inspect.signature for the Python-defined KVCacheInputs. Where Debian's
python3-mypy is installed, mypy checks typing_example.py against the stubs."""
import ast
import inspect
import os
import re
import shutil
import subprocess
import sys

import pytest

import kvcache

HERE = os.path.dirname(os.path.abspath(__file__))
STUB_DIR = os.path.join(HERE, "..", "..", "python")
STUB = os.path.join(STUB_DIR, "kvcache.pyi")

# Runtime members that are pybind11's or Python's machinery, not our API.
MACHINERY = {"__init__", "__repr__", "__str__", "__doc__", "__module__", "__dict__",
             "__weakref__", "__members__", "__entries", "__getstate__", "__setstate__",
             "__ne__", "__hash__", "__int__", "__index__", "__eq__"}


def stub_tree():
    with open(STUB) as f:
        return ast.parse(f.read(), STUB)


def public(name):
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def body_names(body):
    """Top-level names of a module or class body (functions, classes, annotated
    or assigned names), public ones only."""
    names = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.setdefault(node.name, []).append(node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.setdefault(node.target.id, []).append(node)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names.setdefault(target.id, []).append(node)
    return {k: v for k, v in names.items() if public(k)}


def runtime_module_names():
    return {n for n in dir(kvcache) if not n.startswith("_")} | {"__version__"}


def runtime_class_names(cls):
    return {n for n in vars(cls) if public(n) and n not in MACHINERY}


def test_every_module_name_has_a_stub_and_every_stub_a_name():
    stubbed = set(body_names(stub_tree().body))
    runtime = runtime_module_names()
    assert sorted(runtime - stubbed) == [], "names without a stub entry"
    assert sorted(stubbed - runtime) == [], "stub entries the module does not have"


def stub_classes():
    return {n: nodes[0] for n, nodes in body_names(stub_tree().body).items()
            if isinstance(nodes[0], ast.ClassDef)}


@pytest.mark.parametrize("name", sorted(stub_classes()))
def test_every_class_member_has_a_stub_and_every_stub_a_member(name):
    cls = getattr(kvcache, name)
    stubbed = {n for n in body_names(stub_classes()[name].body) if n not in MACHINERY}
    runtime = runtime_class_names(cls)
    if issubclass(cls, BaseException):
        runtime = set()  # the exceptions add nothing public
    if name == "KVCacheInputs":  # `batch` is an instance attribute, set by fetch
        m = kvcache.ContinuousBatchingKVCacheManager(
            kvcache.KVCacheParams(n_kv_heads=1, head_dim=8), 1, 8, 1)
        assert isinstance(m.fetch(m.claim(1)).batch, kvcache.KVCacheBatch)
        stubbed.discard("batch")
    assert sorted(runtime - stubbed) == [], f"{name}: members without a stub entry"
    assert sorted(stubbed - runtime) == [], f"{name}: stub entries the class does not have"
    dunders = {n for n in body_names(stub_classes()[name].body) if n in MACHINERY}
    assert sorted(n for n in dunders if n not in vars(cls)) == [], f"{name}: no such dunder"


# ---- signatures -------------------------------------------------------------------------


def split_params(text):
    """Splits a parameter list at top-level commas (brackets and quotes nest)."""
    parts, depth, quote, cur = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def params_of_text(text):
    """(name, keyword_only, has_default) of each parameter after self/cls."""
    out, kw_only = [], False
    for part in split_params(text):
        if part == "*":
            kw_only = True
            continue
        name = re.match(r"\*{0,2}(\w+)", part).group(1)
        out.append((name, kw_only, "=" in part))
    if out and out[0][0] in ("self", "cls"):
        out = out[1:]
    return tuple(out)


def runtime_signatures(obj, name):
    """The parameter tuples of a runtime callable: pybind11's docstring
    signature(s), or inspect.signature for a Python function."""
    if inspect.isfunction(obj):
        return {tuple((p.name, p.kind is p.KEYWORD_ONLY, p.default is not p.empty)
                      for p in inspect.signature(obj).parameters.values()
                      if p.name not in ("self", "cls"))}
    doc = getattr(obj, "__doc__", None) or ""
    sigs = re.findall(rf"^(?:\d+\. )?{re.escape(name)}\((.*)\) ->", doc, re.M)
    assert sigs, f"no signature of {name} in its docstring: {doc[:200]!r}"
    return {params_of_text(s) for s in sigs}


def stub_signature(node):
    args = node.args
    positional = args.posonlyargs + args.args
    defaults = [False] * (len(positional) - len(args.defaults)) + [True] * len(args.defaults)
    out = [(a.arg, False, d) for a, d in zip(positional, defaults)]
    out += [(a.arg, True, d is not None) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if out and out[0][0] in ("self", "cls"):
        out = out[1:]
    return tuple(out)


def is_property(node):
    return any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)


def stub_functions():
    """(qualified name, runtime object, [FunctionDef, ...]) of every stub function."""
    found = []
    for name, nodes in body_names(stub_tree().body).items():
        if isinstance(nodes[0], ast.FunctionDef):
            found.append((name, getattr(kvcache, name), nodes))
        elif isinstance(nodes[0], ast.ClassDef):
            cls = getattr(kvcache, name)
            for member, defs in body_names(nodes[0].body).items():
                funcs = [d for d in defs if isinstance(d, ast.FunctionDef) and not is_property(d)]
                if funcs and member in vars(cls):
                    found.append((f"{name}.{member}", getattr(cls, member), funcs))
    return found


@pytest.mark.parametrize("qualname,obj,defs", stub_functions(),
                         ids=[f[0] for f in stub_functions()])
def test_stub_parameters_equal_the_runtime_ones(qualname, obj, defs):
    runtime = runtime_signatures(obj, qualname.split(".")[-1])
    stubbed = {stub_signature(d) for d in defs}
    if len(defs) == 1 and len(runtime) == 1:
        assert stubbed == runtime
    else:  # overloads on either side: the same parameter names overall
        names = lambda sigs: {p[0] for sig in sigs for p in sig}  # noqa: E731
        assert names(stubbed) == names(runtime)


def test_properties_are_properties():
    for name, node in stub_classes().items():
        cls = getattr(kvcache, name)
        for member, defs in body_names(node.body).items():
            if any(isinstance(d, ast.FunctionDef) and is_property(d) for d in defs):
                assert isinstance(vars(cls).get(member), property), f"{name}.{member}"


# ---- mypy -------------------------------------------------------------------------------


def test_the_typing_example_runs():
    import typing_example
    typing_example.main()


def test_mypy_accepts_the_example_and_catches_misuse(tmp_path):
    pytest.importorskip("mypy", reason="python3-mypy is not installed")
    example = os.path.join(HERE, "typing_example.py")
    misuse = tmp_path / "misuse.py"
    misuse.write_text("import kvcache\n"
                      "pool = kvcache.ThreadPool(threads=2)\n"
                      "n: str = pool.num_threads\n"                       # line 3: int
                      "kvcache.KVCacheParams(n_kv_heads=2)\n"             # line 4: head_dim
                      "kvcache.attention([], 0, [], [], scale='x')\n")    # line 5: scale
    env = dict(os.environ, MYPYPATH=os.path.abspath(STUB_DIR))
    env.pop("PYTHONPATH", None)  # the stubs, not the built module
    cmd = [sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
           "--cache-dir", str(tmp_path / "cache")]
    good = subprocess.run(cmd + [example], capture_output=True, text=True, env=env)
    assert good.returncode == 0, good.stdout + good.stderr
    bad = subprocess.run(cmd + [str(misuse)], capture_output=True, text=True, env=env)
    lines = sorted({int(m) for m in re.findall(r"misuse\.py:(\d+): error", bad.stdout)})
    assert lines == [3, 4, 5], bad.stdout


def test_cmake_install_ships_module_and_stubs(tmp_path):
    build = os.path.dirname(os.path.dirname(os.path.abspath(kvcache.__file__)))
    if not os.path.exists(os.path.join(build, "CMakeCache.txt")) or not shutil.which("cmake"):
        pytest.skip("kvcache is not imported from a CMake build tree")
    subprocess.run(["cmake", "--install", build, "--component", "python", "--prefix",
                    str(tmp_path)], check=True, capture_output=True)
    site = [p for p in tmp_path.rglob("kvcache.pyi")]
    assert len(site) == 1, site
    site = site[0].parent
    assert {p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()} == {
        os.path.basename(kvcache.__file__), "kvcache.pyi", "kvcache-stubs/__init__.pyi",
        "kvcache-stubs/py.typed"}
    with open(STUB) as f:
        assert (site / "kvcache-stubs" / "__init__.pyi").read_text() == f.read()
