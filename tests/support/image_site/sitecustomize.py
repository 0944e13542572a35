"""Imported at start-up by every Python process whose PYTHONPATH holds this folder (site.py
does so): the top-level modules named in KIMI_HIDDEN_MODULES (comma-separated) then fail to
import, as on a machine without them. tests/support/gpu_image.py names the modules the GPU
machines' image lacks, so a dry run of bench/gpu_run.sh meets what the real one would."""
import importlib.abc
import os
import sys

HIDDEN = frozenset(filter(None, os.environ.get("KIMI_HIDDEN_MODULES", "").split(",")))


class _Hidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden: not on the GPU image)",
                                      name=name)
        return None


if HIDDEN:
    sys.meta_path.insert(0, _Hidden())
    if os.environ.get("KIMI_HIDDEN_LOG"):  # which processes hid them: the test reads it
        try:
            with open("/proc/self/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            command = " ".join(sys.argv)
        with open(os.environ["KIMI_HIDDEN_LOG"], "a") as log:
            log.write(command + "\n")
