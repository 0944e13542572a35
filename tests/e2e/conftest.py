"""The real-client suite needs root (run_client.sh makes namespaces), ../shared beside the
repository, and the client CLIs (installed once, about 7 minutes)."""
import os
import shutil
import subprocess

import pytest

from tests.e2e.harness import RUNNER


@pytest.fixture(scope="session", autouse=True)
def clients_installed():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("the real-client suite needs root and unshare (it makes network namespaces)")
    if not RUNNER.exists():
        pytest.fail(f"{RUNNER} is missing: ../shared sits beside the repository")
    subprocess.run(["bash", str(RUNNER.parent / "install.sh")], check=True, timeout=1800)
