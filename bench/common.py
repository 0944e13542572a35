"""Shared bits for the benchmark scripts: hardware naming, results files and their records."""
import datetime
import json
import os
import pathlib
import platform
import subprocess
import threading
import time

BENCH = pathlib.Path(__file__).resolve().parent


def hardware() -> str:
    """"AMD EPYC, AVX-512 VNNI, 2 cores, 24 GiB": the model name alone does not tell an AVX2
    EPYC from an AVX-512 VNNI one, and the kernels that run differ."""
    model, flags = platform.processor() or "unknown CPU", set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
            if flags and not model.startswith("unknown"):
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0))
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    have = [name for name, flag in SIMD_FLAGS if flag in flags]
    implied = {"AVX-512 VNNI": "AVX-512", "AVX-512": "AVX2", "AVX-VNNI": "AVX2"}
    simd = ", ".join(n for n in have if not any(implied.get(o) == n for o in have))
    return f"{model}, {simd + ', ' if simd else ''}{cores} cores, {mem_gib:.0f} GiB"


# The CPU features that pick our kernels and llama.cpp's, widest first ("avx_vnni" is the
# 256-bit VEX form); hardware() leaves out what a wider one implies.
SIMD_FLAGS = [("AMX", "amx_int8"), ("AVX-512 VNNI", "avx512_vnni"), ("AVX-VNNI", "avx_vnni"),
              ("AVX-512", "avx512f"), ("AVX2", "avx2")]


def copy_bandwidth(device_type: str, mib: int) -> float:
    """Bytes/s of one tensor copy of `mib` MiB on the device, bytes read + written counted,
    best of 5: timed by CUDA events on a GPU (no launch or host overhead in it), by the
    clock on the CPU. The ceiling a memory-bound kernel is compared with."""
    import torch

    src = torch.empty(mib << 20, dtype=torch.uint8, device=device_type)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(5):
        if device_type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            start = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - start)
    return 2 * src.numel() / min(times)


def device_name(device_type: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device_type == "cuda" else hardware()


def today() -> str:
    return datetime.date.today().isoformat()


def write_json(name: str, payload: dict, folder: pathlib.Path | None = None) -> pathlib.Path:
    """bench/results/NAME-DATE.json; a later run the same day gets NAME-DATE-2.json, -3, ...:
    a results file is never overwritten."""
    folder = folder or BENCH / "results"
    folder.mkdir(parents=True, exist_ok=True)
    out, n = folder / f"{name}-{today()}.json", 1
    while out.exists():
        n += 1
        out = folder / f"{name}-{today()}-{n}.json"
    with out.open("x") as f:                      # "x": fails rather than overwrite
        f.write(json.dumps(payload, indent=2) + "\n")
    return out


OUTPUTS = (":(top,exclude)bench/results", ":(top,exclude)bench/RESULTS.md", ":(top,exclude)README.md")


def commit() -> str:
    """The code measured: HEAD's short hash, "+ changes" when tracked files differ from it
    (the records and the tables generated from them are not code: a run after another,
    uncommitted between them, measured HEAD all the same)."""
    def git(*args) -> str:
        done = subprocess.run(["git", *args], cwd=BENCH, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", *OUTPUTS)
    return head + (" + changes" if changed else "")


def record_line(path: str, lines: list[str], command: str):
    """A GPU script's --record: one line "- DATE first; second; ... (`command`)" appended."""
    text = " ".join(filter(None, [lines[0], "; ".join(line.strip() for line in lines[1:])]))
    with open(path, "a") as f:
        f.write(f"- {today()} {text} (`{command}`)\n")


def record(name: str, payload: dict, title: str, command: str, lines: list[str],
           folder: pathlib.Path | None = None) -> pathlib.Path:
    """One run: bench/results/NAME-DATE[-N].json with its hardware, date, commit and report
    (title, command, the table lines with the baseline), then bench/RESULTS.md and README.md's
    measured table regenerated from the newest records (bench/results_md.py). With a folder
    (a GPU run's $OUT, copied into bench/results/ later) the file goes there, nothing else."""
    payload = {"hardware": hardware(), "date": today(), "commit": commit(), **payload,
               "report": {"title": title, "command": command.strip(),
                          "lines": "\n".join(lines).strip("\n").split("\n")}}
    path = write_json(name, payload, folder)
    if folder is None:
        import results_md  # a bench script's sibling (bench/ is first on its sys.path)
        results_md.main([])
    return path


def unix_metrics(sock: str) -> dict[str, float]:
    """GET /metrics over the engine's socket -> sample name (labels included) -> value."""
    import http.client
    import socket

    conn = http.client.HTTPConnection("engine", timeout=60)
    conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.sock.connect(sock)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return {name: float(value) for name, _, value in
            (line.rpartition(" ") for line in text.splitlines() if not line.startswith("#"))
            if name}


def unix_post(sock: str, path: str, body: "dict | str", stream: bool = False):
    """POST body (a dict, or its JSON already encoded) to the engine's socket."""
    import http.client
    import socket

    class Conn(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(sock)

    conn = Conn("engine", timeout=600)
    conn.request("POST", path, body if isinstance(body, str) else json.dumps(body),
                 {"content-type": "application/json"})
    resp = conn.getresponse()
    return conn, resp


def stream_text_times(sock: str, prompt, max_tokens: int) -> tuple[float, float, int]:
    """One greedy streamed /v1/completions call over the engine's socket -> (perf_counter of
    the first chunk of tokens, of the last, 1 + the tokens after the first chunk): so (count - 1)
    / (last - first) is decode tok/s. Tokens, not chunks: a chunk carries a step's tokens, a
    verify step's accepted drafts too (07493a6), so counting chunks read speculation's rate
    as the rate of its steps."""
    conn, resp = unix_post(sock, "/v1/completions", {
        "model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "stream": True, "ignore_eos": True, "return_token_ids": True})
    first = last = None
    count = 0
    by_text = [None, None, 0]  # an engine older than return_token_ids (ab_engine.py's --base)
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data: {"):
            continue
        choice = json.loads(line[6:])["choices"][0]
        ids = choice.get("token_ids") or ()
        now = time.perf_counter()
        if choice.get("text"):  # counted by chunk, in case no chunk carries ids
            by_text = [by_text[0] or now, now, by_text[2] + 1]
        if ids:  # a chunk of tokens (its text may wait for the rest of a character)
            count += 1 if first is None else len(ids)
            first, last = first or now, now
    conn.close()
    return tuple(by_text) if first is None and by_text[2] else (first, last, count)


def token_chunks(sock: str, prompt, max_tokens: int, key, speculative: bool = True,
                 usage: dict | None = None) -> list[tuple[float, list[int]]]:
    """One greedy stream -> [(arrival time, token ids in the chunk), ...], chunks with ids.
    speculative=False: the request asks for plain decode (the engine speculates by default).
    usage: a dict the stream's usage chunk is put in (the request then asks for it)."""
    body = {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True, "return_token_ids": True,
            "speculative": speculative}
    if usage is not None:
        body["stream_options"] = {"include_usage": True}
    conn, resp = unix_post(sock, "/v1/completions", body)
    if resp.status != 200:  # raised in the stream's thread: its traceback shows the reply
        raise RuntimeError(f"stream {key}: HTTP {resp.status}: {resp.read()[:300]!r}")
    chunks = []
    for raw in resp:
        line = raw.strip()
        if line.startswith(b"data: {"):
            event = json.loads(line[6:])
            if usage is not None:
                usage.update(event.get("usage") or {})
            got = [i for choice in event["choices"] for i in choice.get("token_ids") or ()]
            if got:
                chunks.append((time.perf_counter(), got))
    conn.close()
    return chunks


def concurrent_chunks(sock: str, prompts: list[str], max_tokens: int,
                      speculative: bool = True) -> list[list]:
    """One greedy stream per prompt, all at once -> each stream's token_chunks, in order."""
    results: dict[int, list] = {}

    def run(i: int, prompt: str):
        results[i] = token_chunks(sock, prompt, max_tokens, i, speculative)

    threads = [threading.Thread(target=run, args=(i, p)) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [results[i] for i in range(len(prompts))]
