"""`make install` into a staging DESTDIR and `make uninstall`: a venv with torch, so minutes;
it runs only under `pytest -m slow` (about 50 s here, with torch from the local wheel)."""
import contextlib
import grp
import os
import shutil
import stat
import subprocess

import pytest

from tests.blackbox.service_helpers import ROOT


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_make_install_then_uninstall(tmp_path, request):
    """make install into a staging DESTDIR (a venv with torch: minutes), from a copy of the
    tracked tree so nothing is built inside the checkout; then make uninstall."""
    if "slow" not in request.config.getoption("markexpr"):  # setup.cfg's -m does not exclude slow
        pytest.skip("creates a venv and installs torch (minutes): run with pytest -m slow")
    src = copy_tracked_tree(tmp_path / "src")
    dest, prefix = tmp_path / "dest", "/opt/kimi-test"
    base = dest / prefix.lstrip("/")
    kept = dest / "etc" / "kimi" / "proxy.toml"  # an operator's config survives install
    kept.parent.mkdir(parents=True)
    kept.write_text('port = 9999\n')
    make(src, "install", prefix, dest)
    for name in ("kimi-engine", "kimi-proxy"):
        wrapper = base / "bin" / name
        assert os.access(wrapper, os.X_OK)
        assert f'exec "{prefix}/lib/kimi-local/bin/{name}" "$@"' in wrapper.read_text()
        unit = (base / "lib/systemd/system" / f"{name}.service").read_text()
        assert unit == (ROOT / "systemd" / f"{name}.service").read_text().replace("@BINDIR@", f"{prefix}/bin")
        assert f"ExecStart={prefix}/bin/{name} serve" in unit
    for installed, shipped in (("share/man/man8/kimi-engine.8", "man/kimi-engine.8"),
                               ("share/man/man8/kimi-proxy.8", "man/kimi-proxy.8"),
                               ("share/man/man5/kimi-local.conf.5", "man/kimi-local.conf.5"),
                               ("lib/sysusers.d/kimi.conf", "systemd/kimi.sysusers"),
                               ("share/doc/kimi-local/engine.toml", "etc/engine.toml"),
                               ("../../etc/logrotate.d/kimi-local", "systemd/kimi-local.logrotate"),
                               ("../../etc/kimi/engine.toml", "etc/engine.toml")):
        assert (base / installed).read_text() == (ROOT / shipped).read_text(), installed
    assert kept.read_text() == 'port = 9999\n'
    assert stat.S_IMODE((dest / "etc/kimi/engine.toml").stat().st_mode) == 0o640
    doctor = subprocess.run([str(base / "lib/kimi-local/bin/kimi-engine"), "doctor", "--socket",
                             str(tmp_path / "run" / "engine.sock")], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr  # helper built, model present
    make(src, "uninstall", prefix, dest)
    left = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert left == ["etc/kimi/engine.toml", "etc/kimi/proxy.toml"], left  # configs are kept


def test_install_writes_configs_0640_and_warns_about_a_readable_one(tmp_path):
    """tools/install.sh into a DESTDIR whose venv is a stub (pip does nothing): seconds.
    The configs may hold keys: 0640, group kimi where root installs and the group exists."""
    dest, prefix = tmp_path / "dest", "/opt/kimi-test"
    stub = dest / prefix.lstrip("/") / "lib/kimi-local/bin/python"
    stub.parent.mkdir(parents=True)
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    kept = dest / "etc/kimi/proxy.toml"
    kept.parent.mkdir(parents=True)
    kept.write_text('api-key = "k"\n')
    kept.chmod(0o644)
    with group_kimi() as gid:
        result = subprocess.run(["bash", str(ROOT / "tools/install.sh"), "install", prefix,
                                 str(dest)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    config = dest / "etc/kimi/engine.toml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    if gid is None:
        print("not root (or no groupadd): the configs' owner root:kimi is not checked")
    else:
        assert (config.stat().st_uid, config.stat().st_gid) == (0, gid)
    assert f"warning: {kept} (kept) is readable by every user" in result.stderr
    assert stat.S_IMODE(kept.stat().st_mode) == 0o644 and kept.read_text() == 'api-key = "k"\n'


@contextlib.contextmanager
def group_kimi():
    """The gid of group kimi, made for the test (and removed) where root can; else None."""
    try:
        gid = grp.getgrnam("kimi").gr_gid
    except KeyError:
        gid = None
    if gid is not None or os.geteuid() != 0 or not shutil.which("groupadd"):
        yield gid
        return
    subprocess.run(["groupadd", "--system", "kimi"], check=True, timeout=30)
    try:
        yield grp.getgrnam("kimi").gr_gid
    finally:
        subprocess.run(["groupdel", "kimi"], check=True, timeout=30)


def copy_tracked_tree(target):
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True,
                           timeout=60).stdout.decode().split("\0")
    for name in filter(None, names):
        if (ROOT / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    return target


def make(src, target: str, prefix: str, dest):
    result = subprocess.run(["make", "-C", str(src), target, f"PREFIX={prefix}", f"DESTDIR={dest}",
                             f"PYTHON={shutil.which('python3') or 'python3'}"],
                            capture_output=True, text=True, timeout=1100)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
