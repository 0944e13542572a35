"""llama.cpp baseline for bench/decode.py, in its own process (no torch loaded beside it).

    python bench/llamacpp_run.py GGUF TOKENS_JSON DECODE_PROMPT PREFILL_PROMPT NEW REPEATS [--no-extra-bufts]
prints {"decode_tok_s": ..., "prefill_tok_s": ..., "config": ...} as JSON. By default llama.cpp
runs its default, fastest configuration (extra buffer types on: repacked Q4 weights, AMX);
--no-extra-bufts is the fallback bench/decode.py takes when that crashes on a machine.
"""
import json
import statistics
import sys
import time

import llama_cpp.llama_cpp as llama_capi
from llama_cpp import Llama


def _without_extra_buffers():
    """Plain CPU buffers: this llama.cpp build (native, AMX present) segfaulted in its AMX
    extra-buffer path on one Xeon. Llama() reads the defaults at load."""
    defaults = llama_capi.llama_model_default_params

    def params():
        p = defaults()
        p.use_extra_bufts = False
        return p
    llama_capi.llama_model_default_params = params


def main():
    gguf, tokens_path = sys.argv[1], sys.argv[2]
    decode_prompt, prefill_prompt, new, repeats = map(int, sys.argv[3:7])
    plain = "--no-extra-bufts" in sys.argv[7:]
    tokens = json.load(open(tokens_path))
    if plain:
        _without_extra_buffers()
    llm = Llama(model_path=gguf, n_threads=2, n_threads_batch=2,
                n_ctx=max(1024, decode_prompt + new + 64), n_batch=512, verbose=False)

    def decode_once() -> float:
        stamps = []
        for _ in llm.create_completion(tokens[:decode_prompt], max_tokens=new, temperature=0.0,
                                       stream=True):
            stamps.append(time.perf_counter())
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])

    def prefill_once() -> float:
        llm.reset()
        start = time.perf_counter()
        llm.eval(tokens[:prefill_prompt])
        return prefill_prompt / (time.perf_counter() - start)

    decode_once()
    print(json.dumps({"decode_tok_s": statistics.median(decode_once() for _ in range(repeats)),
                      "prefill_tok_s": statistics.median(prefill_once() for _ in range(3)),
                      "config": "use_extra_bufts=False" if plain else "default"}))


if __name__ == "__main__":
    main()
