"""doctor's lines for models named by id (ORG/REPO[@REVISION]), the disk they take, the RAM
the plan keeps on the CPU side, and the hub settings huggingface_hub will use.

    ok model: moonshotai/Kimi-Linear-48B-A3B-Instruct: pulled, commit 1a2b.., plan selective, ...
    ok disk: 812.3 GiB free in /var/cache/kimi/models; the model is pulled (26.9 GiB)
    ok ram: the plan keeps 4.1 GiB in RAM, 118.2 GiB available
    ok hub: endpoint https://huggingface.co, token set (HF_TOKEN), HF_HUB_OFFLINE off

A token's value is never printed. Nothing here downloads weights: planning a pull that has not
happened reads the shard headers over Range requests (and the small index into the HF cache)."""
from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass

from engined.config import EngineConfig, format_size


@dataclass(frozen=True)
class Check:
    """One doctor line (doctor.py's checks make them too)."""
    name: str
    is_ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        mark = "ok" if self.is_ok else "x "
        fix = f"  (fix: {self.fix})" if self.fix and not self.is_ok else ""
        return f"{mark} {self.name}: {self.detail}{fix}"


def check_pulled(hub_id) -> Check:
    """The model line for an id: held in the cache (verified by sizes and headers), or not."""
    from engined.weights.hub import store
    from engined.weights.manifest import verify_artifact
    from engined.weights.shards import CheckpointError

    entry = store.find(hub_id)
    if entry is None:
        return Check("model", False, f"{hub_id}: not in the cache {store.root()}",
                      f"run {store.pull_hint(hub_id)}")
    o = entry.origin
    try:
        summary = verify_artifact(entry.path, rehash=False)
    except CheckpointError as exc:
        return Check("model", False, f"{hub_id}: {entry.path}: {exc}",
                      f"kimi-engine models rm {entry.id}, then {store.pull_hint(hub_id)}")
    return Check("model", True, f"{hub_id}: pulled, commit {entry.commit[:12]}, plan "
                  f"{o.get('plan')}, {o.get('kind')}, verified {o.get('verified')}; manifest "
                  f"matches {summary['files']} files by size and header now (kimi-engine "
                  f"verify {entry.path} re-hashes)")


def check_disk(config: EngineConfig) -> Check:
    """Free disk for the cache against what the model needs there: nothing more once pulled,
    else the pull's plan (the artifact plus one BF16 shard)."""
    from engined.weights.hub import ids, pull, remote, store
    from engined.weights.shards import CheckpointError

    where = store.root()
    free = pull.disk_free(where)
    hub_id = ids.parse(config.model)
    if hub_id is None:
        return Check("disk", True, f"{format_size(free)} free in {where}")
    held = store.find(hub_id)
    if held is not None:
        return Check("disk", True, f"{format_size(free)} free in {where}; {hub_id} is pulled "
                                    f"({format_size(held.size)})")
    if remote.is_offline():
        return Check("disk", False, f"{hub_id}: the pull cannot be planned offline "
                      f"({format_size(free)} free in {where})", "unset HF_HUB_OFFLINE to plan it")
    try:
        rev = remote.resolve(hub_id)
        if store.find(ids.HubId(hub_id.repo, rev.commit)) is not None:
            return Check("disk", True, f"{format_size(free)} free; commit {rev.commit[:12]} is pulled")
        need = pull.plan_pull(rev)
    except CheckpointError as exc:
        return Check("disk", False, str(exc), "check the id, HF_ENDPOINT and HF_TOKEN")
    detail = f"the pull needs {format_size(need.need)} ({need.what}), {format_size(free)} free in {where}"
    return Check("disk", free >= need.need, detail,
                  "free some space, or set XDG_CACHE_HOME (CACHE_DIRECTORY) to a larger disk")


def available_ram(meminfo: pathlib.Path = pathlib.Path("/proc/meminfo")) -> int:
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_ram(config: EngineConfig, memory, on_cuda: bool) -> Check:
    """The plan's RAM part (a GPU model's routed experts in RAM; on the CPU all of it) against
    the RAM available now."""
    need = memory.in_ram if on_cuda else memory.budget.total_bytes
    have = available_ram()
    part = "routed experts kept in RAM" if on_cuda else "weights and KV cache in RAM"
    return Check("ram", need <= have, f"the plan keeps {format_size(need)} in RAM ({part}), "
                  f"{format_size(have)} available", "use --gpu-memory or fewer --n-cpu-moe layers "
                  "on a GPU, a smaller --max-context, or a machine with more RAM")


def check_hub(config: EngineConfig) -> Check:
    """The endpoint, whether a token is set (never its value) and offline mode."""
    from huggingface_hub import constants, get_token

    endpoint = constants.ENDPOINT + (" (HF_ENDPOINT)" if os.environ.get("HF_ENDPOINT") else "")
    if os.environ.get("HF_TOKEN"):
        token = "token set (HF_TOKEN)"
    elif get_token():
        token = "token set (stored by hf auth login)"
    else:
        token = "no token (public repositories only)"
    offline = "on: nothing is downloaded" if constants.is_offline_mode() else "off"
    return Check("hub", True, f"endpoint {endpoint}, {token}, HF_HUB_OFFLINE {offline}")
