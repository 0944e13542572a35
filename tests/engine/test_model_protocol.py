"""Both model families and the tests' stand-in implement engined/models/protocol.py, and the
engine and prefix cache never probe a model for what it can do."""
import ast
import inspect
import pathlib

import pytest
import torch

from engined.models.protocol import Cache, Model
from engined.weights.kimi_checkpoint import load_kimi_linear
from tests.support import kimi_tiny
from tests.support.engine import ScriptedModel

ENGINE_DIR = pathlib.Path(__file__).resolve().parents[2] / "engined" / "engine"


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    return load_kimi_linear(kimi_tiny.write_tiny_checkpoint(tmp_path_factory.mktemp("kimi") / "t"),
                            progress=False).model


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
        assert isinstance(getattr(obj, name), (int, bool)), f"{type(obj).__name__}.{name}"


@pytest.mark.parametrize("family", ["llama", "kimi", "scripted"])
def test_models_and_caches_implement_the_protocol(family, request):
    model = ScriptedModel(vocab_size=8) if family == "scripted" else request.getfixturevalue(family)
    model = getattr(model, "model", model)  # the llama fixture is a loaded bundle
    assert_implements(model, Model)
    assert_implements(model.new_cache(16), Cache)


def test_decode_batch_rows_equal_lone_forwards_on_kimi(kimi):
    """Kimi-Linear's decode_batch (sequences in turn, until the batched runner) matches a
    lone forward per sequence at different positions."""
    prompts = [[3, 5, 7], [11, 2], [9, 9, 9, 4]]
    together, alone = [kimi.new_cache(16) for _ in prompts], [kimi.new_cache(16) for _ in prompts]
    for ids, a, b in zip(prompts, together, alone):
        kimi.forward(torch.tensor(ids), a, 0)
        kimi.forward(torch.tensor(ids), b, 0)
    tokens = torch.tensor([1, 4, 6])
    logits = kimi.decode_batch(tokens, together, [len(p) for p in prompts])  # [3, V]
    for i, (ids, cache) in enumerate(zip(prompts, alone)):
        assert torch.equal(logits[i], kimi.forward(tokens[i:i + 1], cache, len(ids))[0])


def test_the_engine_never_probes_the_model():
    """hasattr/getattr on anything is a capability probe in the engine's own modules."""
    for path in ENGINE_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("hasattr", "getattr"), f"{path.name}:{node.lineno}"
