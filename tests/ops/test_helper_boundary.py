"""One C wrapper: no production module outside engined/helper/ touches the cffi library.

The ops and layers call the wrapper's functions (which validate, allocate or accept the
buffers and map status codes); nothing else imports engined._kimi_helper or reads the
wrapper's `lib`/`ffi`, through the package or one of its modules. C constants reach Python
through the wrapper too (helper.MAX_ROWS)."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "engined" / "helper"
WRAPPER = set(PACKAGE.rglob("*.py")) | {ROOT / "engined" / "_helper_build.py"}
PRODUCTION = ("engined", "proxy", "bench", "tools")
MODULES = {"engined.helper"} | {f"engined.helper.{p.stem}" for p in PACKAGE.glob("*.py")
                                if p.stem != "__init__"}


def production_modules():
    for top in PRODUCTION:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path not in WRAPPER:
                yield path


def dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a chain of names, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return base and f"{base}.{node.attr}"
    return None


def helper_names(tree: ast.AST) -> set[str]:
    """The names a module binds to the wrapper package or one of its modules."""
    names = {"helper"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name for a in node.names if a.name in MODULES}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {a.asname or a.name for a in node.names
                      if f"{node.module}.{a.name}" in MODULES}
    return names


def cffi_uses(tree: ast.AST) -> list[str]:
    """`helper.lib`, `helper.ffi` (or a wrapper module's), and any import of the compiled
    module or of lib/ffi."""
    found, wrapper = [], helper_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("lib", "ffi") \
                and dotted(node.value) in wrapper:
            found.append(f"line {node.lineno}: {dotted(node)}")
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names
                      if "_kimi_helper" in a.name]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = {a.name for a in node.names}
            if "_kimi_helper" in node.module or "_kimi_helper" in names \
                    or (node.module in MODULES and names & {"lib", "ffi"}):
                found.append(f"line {node.lineno}: from {node.module} import "
                             f"{', '.join(sorted(names))}")
    return found


def test_only_the_wrapper_touches_the_cffi_library():
    offenders = {}
    for path in production_modules():
        uses = cffi_uses(ast.parse(path.read_text(), str(path)))
        if uses:
            offenders[str(path.relative_to(ROOT))] = uses
    assert offenders == {}


def test_the_check_sees_each_way_in():
    code = ("from engined import helper\nhelper.lib.gemv_simd(2)\nx = helper.ffi.NULL\n"
            "from engined._kimi_helper import lib\nimport engined._kimi_helper\n"
            "from engined.helper import ffi\nfrom engined import _kimi_helper\n"
            "from engined.helper.core import lib\nfrom engined.helper import core\n"
            "core.ffi.cast\nimport engined.helper.system as system\nsystem.lib.q8_simd()\n"
            "import engined.helper\nengined.helper.lib.KH_OK\n")
    assert len(cffi_uses(ast.parse(code))) == 10


def test_the_check_leaves_other_libs_alone():
    code = "import ctypes\nctypes.util.lib\nfrom engined import helper\nhelper.gemv_simd()\n"
    assert cffi_uses(ast.parse(code)) == []


def test_the_wrapper_is_the_package():
    assert not (ROOT / "engined" / "helper.py").exists()
    assert PACKAGE / "__init__.py" in WRAPPER and len(MODULES) > 1


def test_max_rows_comes_from_c():
    from engined import helper
    assert helper.available()
    assert helper.MAX_ROWS == helper.lib.KH_MAX_ROWS == helper._header_max_rows()
    csrc = "\n".join(p.read_text() for p in sorted((ROOT / "csrc").glob("*.[ch]")))
    assert csrc.count("#define KH_MAX_ROWS") == 1
