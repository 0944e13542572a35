"""A long prefill with a decode stream beside it (issue 29: "decode of a second stream while
the 32k prefill runs: no step slower than 2x its lone step"). bench/serve_streams.py runs it
after its prefills.

One greedy stream (speculation off: a token a step, so a gap between tokens is a step) decodes
alone for LONE_TOKENS tokens; then a fresh prompt of num_tokens is sent as a non-streamed
request with max_tokens 1; once it has answered the stream runs AFTER_TOKENS more tokens and is
closed. Its lone step is the median gap of its lone tokens; its slowest step beside the prefill
is the largest gap that ends after the prefill was sent, up to the first token after the
prefill answered."""
import json
import random
import statistics
import threading
import time

from common import unix_post

LONE_TOKENS = 32
AFTER_TOKENS = 8
STREAM_TOKENS = 192  # the stream's max_tokens: with the prompt, it must fit the engine's token
# budget (--max-context: all running sequences' prompt + max_tokens) beside the prefill's


def prefill_beside_decode(sock: str, num_tokens: int, seed: int, timeout: float = 600) -> dict:
    arrivals: list[float] = []
    lone, done = threading.Event(), threading.Event()
    failure: list[str] = []

    def decode():
        conn, resp = unix_post(sock, "/v1/completions", {
            "model": "default", "prompt": "Beside the prefill: count on and on.",
            "max_tokens": STREAM_TOKENS, "temperature": 0, "stream": True, "ignore_eos": True,
            "speculative": False, "return_token_ids": True})
        try:
            if resp.status != 200:
                failure.append(f"HTTP {resp.status}: {resp.read()[:300]!r}")
                return
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data: {"):
                    continue
                got = json.loads(line[6:])["choices"][0].get("token_ids") or []
                arrivals.extend([time.perf_counter()] * len(got))
                if len(arrivals) > LONE_TOKENS:
                    lone.set()
                if done.is_set():
                    break
        finally:
            conn.close()  # a stream closed early is cancelled by the engine
            lone.set()

    thread = threading.Thread(target=decode, daemon=True)
    thread.start()
    if not lone.wait(timeout) or failure or len(arrivals) <= LONE_TOKENS:
        raise RuntimeError(f"the stream beside the prefill did not decode: {failure or arrivals}")
    ids = random.Random(seed).choices(range(256), k=num_tokens)
    sent = time.perf_counter()
    conn, resp = unix_post(sock, "/v1/completions", {
        "model": "default", "prompt": ids, "max_tokens": 1, "temperature": 0})
    body = json.loads(resp.read())
    conn.close()
    answered = time.perf_counter()
    if resp.status != 200:
        raise RuntimeError(f"prefill of {num_tokens} tokens beside a stream: HTTP {resp.status}: {body}")
    end = time.monotonic() + 60  # AFTER_TOKENS steps, at most a minute
    while thread.is_alive() and time.monotonic() < end:
        if sum(t > answered for t in arrivals) >= AFTER_TOKENS:
            break
        time.sleep(0.01)
    done.set()
    thread.join(timeout)
    times = list(arrivals)
    gaps = [(b, b - a) for a, b in zip(times, times[1:])]
    lone_step = statistics.median(g for _, g in gaps[:LONE_TOKENS - 1])
    after = next((t for t in times if t > answered), None)
    during = [g for t, g in gaps if t > sent and (after is None or t <= after)]
    slowest = max(during) if during else answered - sent
    return {"prompt_tokens": body["usage"]["prompt_tokens"], "ttft_s": answered - sent,
            "lone_step_s": lone_step, "slowest_step_s": slowest,
            "slowest_x_lone": slowest / lone_step,
            "tokens_during_prefill": sum(sent < t <= answered for t in times),
            "stream_outlived_prefill": after is not None}
