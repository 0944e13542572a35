"""An upstream error names the client's field, not the one the proxy sent in its place.

The engine refuses a schema that does not compile with a 400 whose `param` and message name
the Chat field path, `response_format.json_schema.schema.properties.age` or
`tools[2].function.parameters.properties.x`. The client sent another field: Anthropic's
`output_format.schema` (or `output_config.format.schema`) and `tools[i].input_schema`,
Responses' `text.format.schema` and `tools[i].parameters`, at the index the client gave the
tool (hosted tools the proxy leaves out move the others up). The dialects record where each
field came from (`Request.client_fields`, `ToolSpec.source`); `rename` puts those names back
in the error's param and message. What follows the renamed prefix inside the schema is kept,
except for a custom tool, whose schema the proxy wrote from the tool's `format`: the error
names that `format`.
"""
from __future__ import annotations

import re

from proxy import canonical as c
from proxy.errors import ProxyError

_TAIL = r"((?:[.\[][^\s:,;'\"`()]*)?)"  # the rest of the path after a prefix


def upstream_fields(req: c.Request) -> dict[str, tuple[str, bool]]:
    """upstream prefix -> (the client's, whether the path inside it carries over)."""
    fields = {up: (mine, True) for up, mine in req.client_fields}
    for j, tool in enumerate(req.tools):  # the upstream numbers the tools it was sent
        if tool.source:
            fields[f"tools[{j}].function.parameters"] = (tool.source, tool.kind != "custom")
    return fields


def rename_paths(text: str, fields: dict[str, tuple[str, bool]]) -> str:
    """Each upstream path in text, by its longest known prefix, as the client's path (in one pass:
    tools[0] -> tools[1] never then reads as tools[1] -> tools[2])."""
    if not fields or not text:
        return text
    names = "|".join(re.escape(up) for up in sorted(fields, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w.\]])({names})(?!\w){_TAIL}")

    def client(m: re.Match) -> str:
        mine, keeps_tail = fields[m.group(1)]
        return mine + (m.group(2) if keeps_tail else "")
    return pattern.sub(client, text)


def rename(err: ProxyError, req: c.Request | None) -> ProxyError:
    """The upstream's error, its param and message naming the fields this client sent."""
    fields = upstream_fields(req) if req is not None else {}
    if fields:
        err.message = rename_paths(err.message, fields)
        err.args = (err.message,)
        if isinstance(err.param, str):
            err.param = rename_paths(err.param, fields)
    return err
