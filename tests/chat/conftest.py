"""The chat tests' independent reference: transformers' tokenizer and chat template."""
import pytest


@pytest.fixture(scope="module")
def reference(default_gguf, tmp_path_factory):
    """transformers' tokenizer converted from the same GGUF, strictly offline."""
    transformers = pytest.importorskip("transformers")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf")))
        return transformers.AutoTokenizer.from_pretrained(str(default_gguf.parent),
                                                          gguf_file=default_gguf.name)
