"""`make run MODEL=ORG/REPO` (tools/run.py with KIMI_RUN_MODEL): pull in the foreground, then
the engine serves the id and the proxy stands in front of it."""
import signal
import subprocess
import sys
import time

from tests.blackbox.test_run_launcher import RUN_PY, free_port, is_up
from tests.hub.conftest import REPO, artifact_dirs, hub_env
from tests.support.engine import get, short_tmpdir


def test_make_run_with_a_model_id_pulls_then_serves_it(hub, tmp_path):
    home, port = short_tmpdir(), free_port()
    env = hub_env(hub, tmp_path, KIMI_RUN_MODEL=REPO, KIMI_RUN_PORT=str(port),
                  KIMI_ENGINE_MAX_CONTEXT="256", XDG_RUNTIME_DIR=str(home))
    env.pop("RUNTIME_DIRECTORY", None)
    sock = str(home / "kimi" / "engine.sock")
    run = subprocess.Popen([sys.executable, str(RUN_PY)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not is_up(sock, port):
            assert run.poll() is None, run.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "engine and proxy not up"
            time.sleep(0.3)
        assert [p.name for p in artifact_dirs(tmp_path)] == [hub.commit]
        assert [m["id"] for m in get(sock, "/v1/models").json()["data"]] == [REPO]
        run.send_signal(signal.SIGTERM)
        assert run.wait(90) == 128 + signal.SIGTERM
        assert f"pull {REPO}: 100%" in run.stderr.read().decode()
    finally:
        if run.poll() is None:
            run.kill()
