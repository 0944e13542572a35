"""The serve and offload sections' prefill requests over an engine's socket (bench/serve_streams.py,
bench/offload.py): a P-token prompt of fresh random byte-token ids (the prefix cache misses)
timed to its first token, and the same streamed on into a decode at that depth."""
import json
import random
import time

from common import token_chunks, unix_post
from served import Engine


def prefill_ttft(engine: Engine, num_tokens: int, seed: int) -> tuple[float, int]:
    """(seconds to a 1-token reply, prompt tokens the engine counted) for fresh byte-token ids."""
    ids = random.Random(seed).choices(range(256), k=num_tokens)
    start = time.perf_counter()
    conn, resp = unix_post(engine.sock, "/v1/completions", {
        "model": "default", "prompt": ids, "max_tokens": 1, "temperature": 0})
    body = json.loads(resp.read())
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"prefill of {num_tokens} tokens: HTTP {resp.status}: {body}")
    return time.perf_counter() - start, body["usage"]["prompt_tokens"]


def ttft_then_decode(engine: Engine, num_tokens: int, seed: int,
                     new_tokens: int) -> tuple[float, int | None, float | None]:
    """prefill_ttft's prompt streamed with 1 + new_tokens plain-decode tokens -> (seconds to
    the first token, prompt tokens the engine counted, tok/s after the first token's chunk):
    the TTFT and the decode rate at that depth from one prefill."""
    ids = random.Random(seed).choices(range(256), k=num_tokens)
    usage: dict = {}
    start = time.perf_counter()
    chunks = token_chunks(engine.sock, ids, 1 + new_tokens, f"prefill of {num_tokens} tokens",
                          speculative=False, usage=usage)
    if not chunks:
        raise RuntimeError(f"prefill of {num_tokens} tokens: no token came back")
    after, span = sum(len(got) for _, got in chunks[1:]), chunks[-1][0] - chunks[0][0]
    return (chunks[0][0] - start, usage.get("prompt_tokens"),
            after / span if after and span > 0 else None)
