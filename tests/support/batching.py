"""Batched decode against lone forwards, for any Model (engined/models/protocol.py)."""
import torch


def decode_together_and_alone(model, prompts: list[list[int]], capacity: int, steps: int = 3,
                              same_argmax: bool = True):
    """Each prompt prefilled into two caches of `capacity` tokens, then `steps` decode steps:
    all rows in one decode_batch (their positions differ) against a lone forward per sequence,
    each row's logits within 1e-5 of their scale and, with same_argmax, the same greedy token.
    The next step feeds the batched rows' tokens to both. Returns (together, alone) caches."""
    together = [model.new_cache(capacity) for _ in prompts]
    alone = [model.new_cache(capacity) for _ in prompts]
    tokens = []
    for ids, a, b in zip(prompts, together, alone):
        tokens.append(int(model.forward(torch.tensor(ids), a, 0).argmax()))
        model.forward(torch.tensor(ids), b, 0)
    positions = [len(p) for p in prompts]
    for _ in range(steps):
        batched = model.decode_batch(torch.tensor(tokens), together, positions)  # [B, V]
        for i, cache in enumerate(alone):
            lone = model.forward(torch.tensor(tokens[i:i + 1]), cache, positions[i])[0]
            assert (batched[i] - lone).abs().max() <= 1e-5 * lone.abs().max()
            if same_argmax:
                assert int(batched[i].argmax()) == int(lone.argmax())
        tokens = [int(row.argmax()) for row in batched]
        positions = [p + 1 for p in positions]
    return together, alone
