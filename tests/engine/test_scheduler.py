"""Scheduler admission within the token budget, cancellation."""


from engined.engine.scheduler import Scheduler
from engined.engine.sequence import SamplingParams, Sequence


class _Decoder:
    def push(self, token_id):
        return ""

    def flush(self):
        return ""


def _seq(num_prompt, max_tokens):
    return Sequence(list(range(num_prompt)), SamplingParams(max_tokens), _Decoder())


def test_scheduler_admits_within_budget_and_drops_the_cancelled():
    scheduler = Scheduler(token_budget=100)
    a, b, c = _seq(30, 20), _seq(20, 20), _seq(40, 20)  # 50 + 40 + 60 slots
    for seq in (a, b, c):
        scheduler.add(seq)
    assert scheduler.admit() == [a, b]  # c waits: 90 + 60 > 100
    scheduler.finish(a)
    assert scheduler.admit() == [c]
    b.cancel()
    assert scheduler.take_cancelled() == [b]
    assert list(scheduler.running) == [c] and scheduler.num_reserved_tokens == 60


def test_an_oversized_request_still_runs_alone():
    scheduler = Scheduler(token_budget=10)
    big = _seq(8, 8)
    scheduler.add(big)
    assert scheduler.admit() == [big]



def test_a_request_held_for_kv_room_is_named_with_the_one_reserving_the_most():
    scheduler = Scheduler(token_budget=100, max_batch=4)
    whole, small, waiting = _seq(10, 85), _seq(3, 2), _seq(5, 10)  # 95 + 5, then 15: no room
    for seq in (whole, small, waiting):
        scheduler.add(seq)
    assert scheduler.admit() == [whole, small]
    assert scheduler.held_for_room() == (waiting, whole)
    scheduler.finish(small)
    assert scheduler.held_for_room() == (waiting, whole)  # 95 + 15 > 100 still
    scheduler.finish(whole)
    assert scheduler.held_for_room() is None and scheduler.admit() == [waiting]


def test_a_full_batch_is_not_called_a_lack_of_kv_room():
    scheduler = Scheduler(token_budget=1000, max_batch=1)
    first, second = _seq(5, 5), _seq(5, 5)
    scheduler.add(first)
    scheduler.add(second)
    assert scheduler.admit() == [first]
    assert scheduler.held_for_room() is None  # it waits for a place in the batch, not for KV
