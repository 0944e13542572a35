"""OpenAI's `strict: true` (a json_schema response_format, or a function tool): no object may
have properties its schema does not name. OpenAI refuses a strict schema that leaves
`additionalProperties` out; this engine compiles leniently, so it closes such objects itself
(llguidance, like JSON Schema, lets an object without `additionalProperties` take any other
key: a small model then writes keys without end). A schema's own `additionalProperties`
stands. Pure Python: parse.py imports it on every image.
"""
from __future__ import annotations

# Where a JSON schema holds subschemas (compile.py's failing_path walks them too):
SUBSCHEMA_KEYS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LIST_KEYS = ("anyOf", "oneOf", "allOf", "prefixItems")          # lists of schemas
SCHEMA_KEYS = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
               "propertyNames")                                       # one schema each


def closed(schema):
    """A copy of schema with every object schema that names properties and says nothing of
    additionalProperties given `additionalProperties: false`."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in SUBSCHEMA_KEYS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(s) for name, s in out[key].items()}
    for key in SCHEMA_LIST_KEYS:
        if isinstance(out.get(key), list):
            out[key] = closed(out[key])
    for key in SCHEMA_KEYS:
        if isinstance(out.get(key), dict):
            out[key] = closed(out[key])
    if isinstance(out.get("properties"), dict) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out
