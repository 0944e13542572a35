"""What the kernel will grant: the cgroup memory limit and this process's RSS
(engine/memory.py, the memory accounting)."""
import os

from engined.engine import memory


def _fake_cgroup(tmp_path, proc_line: str, files: dict[str, str]):
    proc = tmp_path / "cgroup"
    proc.write_text(proc_line + "\n")
    for rel, text in files.items():
        f = tmp_path / "fs" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text + "\n")
    return dict(proc_cgroup=str(proc), cgroup_root=str(tmp_path / "fs"))


def test_cgroup_v2_limit_takes_the_tightest_ancestor(tmp_path):
    roots = _fake_cgroup(tmp_path, "0::/user.slice/kimi.service", {
        "user.slice/kimi.service/memory.max": "max",
        "user.slice/memory.max": "2147483648",
    })
    assert memory.cgroup_memory_limit(**roots) == 2 << 30
    assert memory.effective_cap(4 << 30, **roots) == (2 << 30, "cgroup memory.max")
    assert memory.effective_cap(1 << 30, **roots) == (1 << 30, "--memory-cap")
    assert memory.effective_cap(0, **roots) == (2 << 30, "cgroup memory.max")  # none of ours


def test_cgroup_v1_limit_and_unlimited_sentinel(tmp_path):
    roots = _fake_cgroup(tmp_path, "4:memory:/docker/abc", {
        "memory/docker/abc/memory.limit_in_bytes": "536870912",
        "memory/memory.limit_in_bytes": "9223372036854771712",
    })
    assert memory.cgroup_memory_limit(**roots) == 512 << 20


def test_no_cgroup_limit_leaves_the_request(tmp_path):
    roots = _fake_cgroup(tmp_path, "0::/", {"memory.max": "max"})
    assert memory.cgroup_memory_limit(**roots) is None
    assert memory.effective_cap(123, **roots) == (123, "--memory-cap")
    assert memory.effective_cap(0, proc_cgroup=str(tmp_path / "missing")) == (0, "--memory-cap")


def test_current_rss_reads_resident_pages(tmp_path):
    statm = tmp_path / "statm"
    statm.write_text("765 441 413 5 0 123 0\n")
    assert memory.current_rss(str(statm)) == 441 * os.sysconf("SC_PAGE_SIZE")
    assert memory.current_rss() > 10 << 20  # this interpreter, with numpy and the helper loaded
    assert memory.current_rss(str(tmp_path / "missing")) == 0
