"""Both model families and the tests' stand-in implement engined/models/protocol.py, and the
engine and prefix cache never probe a model for what it can do."""
import ast
import inspect
import pathlib

import pytest

from engined.models.protocol import Cache, Model
from tests.support.batching import decode_together_and_alone
from tests.support.engine import ScriptedModel

ENGINED = pathlib.Path(__file__).resolve().parents[2] / "engined"
ENGINE_DIR = ENGINED / "engine"


def methods(protocol) -> list[str]:
    return [name for name, value in vars(protocol).items()
            if callable(value) and not name.startswith("_")]


def assert_implements(obj, protocol):
    assert isinstance(obj, protocol)
    for name in methods(protocol):
        want = list(inspect.signature(getattr(protocol, name)).parameters)[1:]  # less self
        have = list(inspect.signature(getattr(obj, name)).parameters)
        assert have[:len(want)] == want, f"{type(obj).__name__}.{name}{have} != {want}"
    for name in protocol.__annotations__:
        assert isinstance(getattr(obj, name), (int, bool, str)), f"{type(obj).__name__}.{name}"


@pytest.mark.parametrize("family", ["llama", "kimi", "scripted"])
def test_models_and_caches_implement_the_protocol(family, request):
    model = ScriptedModel(vocab_size=8) if family == "scripted" else request.getfixturevalue(family)
    model = getattr(model, "model", model)  # the llama fixture is a loaded bundle
    assert_implements(model, Model)
    assert_implements(model.new_cache(16), Cache)


def test_decode_batch_rows_equal_lone_forwards_on_kimi(kimi):
    """Kimi-Linear's batched decode (projections once for all rows, state per row) matches
    a lone forward per sequence at different positions, step after step: the same greedy
    tokens, logits within 1e-5 of their scale (fp32 on the CPU)."""
    prompts = [[3, 5, 7], [11, 2], [9, 9, 9, 4], [8]]
    together, _ = decode_together_and_alone(kimi, prompts, capacity=16, steps=3)
    assert [c.num_tokens for c in together] == [len(p) + 3 for p in prompts]


def test_the_engine_never_probes_the_model():
    """hasattr/getattr on anything is a capability probe in the engine's own modules."""
    for path in ENGINE_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("hasattr", "getattr"), f"{path.name}:{node.lineno}"


def names_a_model(node: ast.expr) -> bool:
    """`model`, `self.model`, `loaded.model`, `kimi_model`, `layer`, `self.layers[i]`: an
    expression naming a model or one of its layers."""
    if isinstance(node, ast.Subscript):
        node = node.value
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return "model" in name.lower() or "layer" in name.lower()


def model_probes(source: str) -> list[int]:
    """Lines of hasattr calls, and getattr calls with a default, whose object names a model or
    a layer: what asks whether it has something. getattr(layer, name) without a default reads
    an attribute that must be there (weights by their checkpoint names)."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args
            and (node.func.id == "hasattr" or node.func.id == "getattr" and len(node.args) == 3)
            and names_a_model(node.args[0])]


def test_the_scan_finds_a_model_probe():
    source = ("x = getattr(model, 'decode_gemv', None)\nhasattr(self.model, 'graph_step')\n"
              "getattr(layer, 'block_sparse_moe', None)\ngetattr(layer, name)\n"
              "hasattr(self.layers[i], 'moe')\ngetattr(config, 'rope', None)\n")
    assert model_probes(source) == [1, 2, 3, 5]


def test_nothing_in_engined_probes_a_model():
    """What a model offers is the Model protocol (engined/models/protocol.py), read directly:
    no module of engined asks a model with hasattr/getattr."""
    found = [f"{path.relative_to(ENGINED)}:{line}" for path in sorted(ENGINED.rglob("*.py"))
             for line in model_probes(path.read_text())]
    assert found == []
