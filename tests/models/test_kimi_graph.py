"""The graph-capturable decode step (position as a device tensor, MLA through the paged op, no
host sync) equals ordinary decode; on CPU it runs eagerly (CUDA capture needs a GPU)."""
import torch

from engined.commands import bench as synthetic_bench
from engined.engine.cuda_graph import GreedyDecoder


def _greedy_forward(model, prompt, steps):
    cache = model.new_cache(len(prompt) + steps + 1)
    token, out, logits_seen = model.forward(prompt, cache, 0).argmax(-1), [], []
    for i in range(steps):
        logits = model.forward(token, cache, len(prompt) + i)
        logits_seen.append(logits)
        token = logits.argmax(-1)
        out.append(int(token))
    return out, torch.cat(logits_seen)


def test_static_decode_step_equals_forward():
    model = synthetic_bench.build("tiny", "cpu", int4=False)
    prompt = torch.randint(0, 500, (17,), generator=torch.Generator().manual_seed(0))
    want_tokens, want_logits = _greedy_forward(model, prompt, 8)
    cache = model.new_cache(40)
    token = model.forward(prompt, cache, 0).argmax(-1)
    rows = []
    for i in range(8):
        rows.append(model.decode_step(token, cache, torch.tensor(17 + i)))
        token = rows[-1].argmax(-1)
    torch.testing.assert_close(torch.cat(rows), want_logits, atol=1e-5, rtol=1e-5)
    assert [int(r.argmax()) for r in rows] == want_tokens


def test_greedy_decoder_matches_forward_greedy_and_resets_cleanly():
    model = synthetic_bench.build("tiny", "cpu", int4=True)
    prompt = torch.randint(0, 500, (17,), generator=torch.Generator().manual_seed(1))
    want, _ = _greedy_forward(model, prompt, 10)
    cache = model.new_cache(40)
    decoder = GreedyDecoder(model, cache, use_graph=False)
    for _ in range(2):                                   # second round after a reset: same tokens
        cache.reset()
        first = model.forward(prompt, cache, 0).argmax(-1)
        assert decoder.run(first, 17, 10).tolist() == want
        assert cache.num_tokens == 27
