"""The request log's formatter (proxy.__main__) writes what logging.Formatter writes."""
import pathlib
import subprocess
import sys

CHECK = r'''
import logging
from proxy.__main__ import _Formatter
spec = "%(asctime)s %(levelname)s %(message)s"
fast, plain = _Formatter(spec), logging.Formatter(spec)
for created in (0.5, 1796212447.3141124, 1796212447.9995, 1796212448.0004, 1796212448.7):
    record = logging.LogRecord("kimi.proxy", logging.INFO, "x.py", 1, "req %s", ("a",), None)
    record.created, record.msecs = created, (created - int(created)) * 1000
    assert fast.format(record) == plain.format(record), (fast.format(record), plain.format(record))
    assert fast.formatTime(record, "%H") == plain.formatTime(record, "%H")
print("ok")
'''


def test_cached_asctime_is_logging_formatters():
    # a subprocess: importing proxy.__main__ patches the process with gevent
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60,
                          cwd=pathlib.Path(__file__).parents[2])
    assert done.stdout.strip() == "ok", done.stderr
