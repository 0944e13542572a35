"""The engine's log: status lines and one line per request, to stderr or --log-file.

`reopen()` (on SIGHUP, for logrotate) swaps the file under the same lock that guards
every write, so no line is lost or torn.
"""
import datetime
import sys
import threading


class LogSink:
    def __init__(self, path=None):
        self.path = path
        self._lock = threading.Lock()
        self._file = self._open()

    def _open(self):
        if self.path is None:
            return sys.stderr
        return open(self.path, "a", encoding="utf-8", buffering=1)

    def write(self, message: str):
        stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
        line = f"{stamp.replace('+00:00', 'Z')} {message}\n"
        with self._lock:
            try:
                self._file.write(line)
                self._file.flush()
            except (OSError, ValueError):
                pass  # a full disk or closed stderr must not take requests down

    def reopen(self):
        if self.path is None:
            return
        with self._lock:
            old, self._file = self._file, self._open()
            old.close()

    def close(self):
        if self.path is not None:
            with self._lock:
                self._file.close()


def request_line(request_id: str, route: str, status: int, stats: dict, elapsed_s: float) -> str:
    """request_id=... route="POST /v1/chat/completions" status=200 prompt_tokens=... ."""
    fields = [f"request_id={request_id}", f'route="{route}"', f"status={status}"]
    seq = stats.get("seq")
    if seq is not None:
        fields += [f"prompt_tokens={seq.num_prompt_tokens}",
                   f"completion_tokens={len(seq.output_ids)}"]
        if seq.first_token_time is not None:
            fields.append(f"ttft_ms={(seq.first_token_time - seq.arrival_time) * 1000:.1f}")
            end = seq.finish_time or seq.first_token_time
            if len(seq.output_ids) > 1 and end > seq.first_token_time:
                fields.append(f"tok_s={(len(seq.output_ids) - 1) / (end - seq.first_token_time):.1f}")
        if seq.grammar is not None:
            fields += seq.grammar.log_fields()
        if seq.spec is not None and seq.spec[1].num_drafted:
            fields.append(f"spec={seq.spec[1].num_accepted}/{seq.spec[1].num_drafted}")
    fields.append(f"ms={elapsed_s * 1000:.1f}")
    return " ".join(fields)
