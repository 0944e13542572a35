"""One C wrapper: no production module outside engined/helper.py touches the cffi library.

The ops and layers call the wrapper's functions (which validate, allocate or accept the
buffers and map status codes); nothing else imports engined._kimi_helper or reads the
wrapper's `lib`/`ffi`. C constants reach Python through the wrapper too (helper.MAX_ROWS)."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
WRAPPER = {ROOT / "engined" / "helper.py", ROOT / "engined" / "_helper_build.py"}
PRODUCTION = ("engined", "proxy", "bench", "tools")


def production_modules():
    for top in PRODUCTION:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path not in WRAPPER:
                yield path


def cffi_uses(tree: ast.AST) -> list[str]:
    """`helper.lib`, `helper.ffi`, and any import of the compiled module or of lib/ffi."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("lib", "ffi") \
                and isinstance(node.value, ast.Name) and node.value.id == "helper":
            found.append(f"line {node.lineno}: helper.{node.attr}")
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names
                      if "_kimi_helper" in a.name]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = {a.name for a in node.names}
            if "_kimi_helper" in node.module or "_kimi_helper" in names \
                    or (node.module == "engined.helper" and names & {"lib", "ffi"}):
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
            "from engined.helper import ffi\nfrom engined import _kimi_helper\n")
    assert len(cffi_uses(ast.parse(code))) == 6


def test_max_rows_comes_from_c():
    from engined import helper
    assert helper.available()
    assert helper.MAX_ROWS == helper.lib.KH_MAX_ROWS == helper._header_max_rows()
    csrc = "\n".join(p.read_text() for p in sorted((ROOT / "csrc").glob("*.[ch]")))
    assert csrc.count("#define KH_MAX_ROWS") == 1
