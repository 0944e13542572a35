"""The socket's directory (issue 25, item 1): the engine binds only in a directory no other
user controls, and says why when it will not. Without XDG_RUNTIME_DIR the socket goes under
/tmp/kimi-$UID, which another local user can make first."""
import os
import pwd

import pytest

from engined.config import UnsafeSocketDir, ensure_socket_dir
from tests.support.engine import run_cli


def other_uid() -> int:
    """An unprivileged uid that is not ours (nobody): giving it a directory needs root."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to a second uid (nobody); run as root")
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user nobody to own the directory")


def private_dir(path, mode=0o700):
    path.mkdir()
    os.chmod(path, mode)
    return path


def test_a_directory_of_another_user_is_refused(tmp_path):
    uid = other_uid()
    directory = private_dir(tmp_path / f"kimi-{os.getuid()}")
    os.chown(directory, uid, -1)
    with pytest.raises(UnsafeSocketDir, match=f"belongs to uid {uid}, not to uid {os.geteuid()}"):
        ensure_socket_dir(directory / "engine.sock")


@pytest.mark.parametrize("mode,kind", [(0o770, "group-writable"), (0o777, "world-writable"),
                                       (0o1777, "world-writable"), (0o720, "group-writable")])
def test_a_writable_directory_is_refused(tmp_path, mode, kind):
    directory = private_dir(tmp_path / "run", mode)
    with pytest.raises(UnsafeSocketDir, match=f"is {kind}") as caught:
        ensure_socket_dir(directory / "engine.sock")
    assert f"chmod 0700 {directory}" in caught.value.fix


def test_a_symlinked_directory_is_refused(tmp_path):
    real = private_dir(tmp_path / "real")
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UnsafeSocketDir, match="is a symlink"):
        ensure_socket_dir(tmp_path / "link" / "engine.sock")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")  # not followed, not created through
    with pytest.raises(UnsafeSocketDir, match="is a symlink"):
        ensure_socket_dir(tmp_path / "dangling" / "engine.sock")
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("mode", [0o700, 0o750, 0o755])
def test_a_directory_of_our_own_is_used(tmp_path, mode):
    ensure_socket_dir(private_dir(tmp_path / "run", mode) / "engine.sock")
    ensure_socket_dir(tmp_path / "made" / "engine.sock")
    assert (tmp_path / "made").is_dir()


def test_serve_refuses_it_with_one_line_and_exit_1(tmp_path):
    """A clean start failure before any model loads: one line on stderr, no traceback."""
    directory = private_dir(tmp_path / "run", 0o777)
    result = run_cli("serve", "--socket", str(directory / "engine.sock"), "--device", "cpu",
                     timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert (f"kimi-engine: socket directory {directory} (mode 0777) is world-writable"
            in lines[0]), lines[0]
    assert not (directory / "engine.sock").exists()


def test_serve_refuses_a_directory_of_another_user(tmp_path):
    uid = other_uid()
    directory = private_dir(tmp_path / "run")
    os.chown(directory, uid, -1)
    result = run_cli("serve", "--socket", str(directory / "engine.sock"), "--device", "cpu",
                     timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"belongs to uid {uid}" in result.stderr
