"""The bounded queue in the scheduler and its two config keys (no model, no daemon)."""
import pytest

from engined.config import ConfigError, EngineConfig
from engined.engine.scheduler import Scheduler
from engined.engine.sequence import SamplingParams, Sequence
from engined.errors import QueueFull, QueueTimeout


def seq(num_tokens: int = 100) -> Sequence:
    return Sequence([1] * num_tokens, SamplingParams(max_tokens=10), decoder=None)


def test_a_full_queue_refuses_one_more():
    scheduler = Scheduler(token_budget=110, max_queue=2)
    scheduler.add(seq())
    scheduler.add(seq())
    with pytest.raises(QueueFull) as refused:
        scheduler.add(seq())
    assert refused.value.status == 429 and refused.value.headers()["Retry-After"] == "5"
    scheduler.admit()  # the first starts (it holds the whole budget): room for one more
    scheduler.add(seq())
    assert scheduler.num_waiting == 2


def test_no_bound_by_default():
    scheduler = Scheduler(token_budget=110)
    for _ in range(100):
        scheduler.add(seq())
    assert scheduler.num_waiting == 100


def test_admission_is_signalled_and_a_waiting_sequence_can_be_withdrawn():
    scheduler = Scheduler(token_budget=110)
    first, second = seq(), seq()
    scheduler.add(first)
    scheduler.add(second)
    assert [s is first for s in scheduler.admit()] == [True]
    assert first.wait_admitted(0) and not second.wait_admitted(0)
    assert not scheduler.withdraw(first)  # started: it stays
    assert scheduler.withdraw(second) and scheduler.num_waiting == 0
    assert QueueTimeout("x").status == 503 and "Retry-After" in QueueTimeout("x").headers()


def test_config_keys():
    config = EngineConfig.layered({}, {"KIMI_ENGINE_MAX_QUEUE": "3",
                                       "KIMI_ENGINE_QUEUE_TIMEOUT_S": "2.5"})
    assert (config.max_queue, config.queue_timeout_s) == (3, 2.5)
    assert (EngineConfig().max_queue, EngineConfig().queue_timeout_s) == (16, 120.0)
    for bad in ({"max_queue": -1}, {"queue_timeout_s": "soon"}, {"queue_timeout_s": -1},
                {"queue_timeout_s": "nan"}):
        with pytest.raises(ConfigError, match=next(iter(bad)).replace("_", "-")):
            EngineConfig(**bad)
