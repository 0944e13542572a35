"""What `kimi-engine serve` holds once it has loaded (engined/serving/daemon.py's _load)."""
import gc

from engined.config import EngineConfig
from engined.serving import daemon
from engined.serving.logs import LogSink


def test_the_loaded_model_is_out_of_the_collectors_sight(tmp_path):
    """A full collection walks every tracked object: with the model's ~181k in sight, 85 ms
    on the model thread, a stall in every stream. After loading, they are frozen."""
    sock = tmp_path / "run" / "engine.sock"
    sock.parent.mkdir(mode=0o700)
    _served, _metrics, engine = daemon._load(
        EngineConfig(model="default", socket=sock, device="cpu", threads=1),
        LogSink(tmp_path / "engine.log"))
    try:
        model = engine.model
        tracked = {id(o) for o in gc.get_objects()}  # the generations: frozen objects are not
        assert id(model) not in tracked and id(engine) not in tracked
        assert gc.get_freeze_count() > 10_000
    finally:
        engine.stop()
        gc.unfreeze()
