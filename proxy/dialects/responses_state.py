"""OpenAI Responses state: what a turn echoes and stores, and `previous_response_id`.

    prepare(ctx, body)   before the payload: the envelope's echoed keys, the tools by name,
                         this turn's input items, and the stored history of
                         `previous_response_id` put before the new input (404 when gone)
    complete(ctx)        once the response is final (JSON body or the stream's terminal
                         event): stored with its input items unless `store` is false
    stored(services, id) / delete_stored(services, id)   GET and DELETE /v1/responses/<id>
"""
from __future__ import annotations

from proxy import canonical as c
from proxy.errors import NotFound

ECHOED = ("tools", "tool_choice", "parallel_tool_calls", "instructions", "metadata", "previous_response_id", "store")


def prepare(ctx, body: dict) -> c.Request:
    from proxy.dialects.openai_responses import parse_input
    req, turn = ctx.req, ctx.turn
    turn.extra["echo"] = {k: body[k] for k in ECHOED if k in body}
    turn.extra["tools_by_name"] = {t.name: t for t in req.tools}
    items = body.get("input")
    items = [{"type": "message", "role": "user", "content": items}] if isinstance(items, str) else list(items or [])
    turn.extra["input_items"] = items
    if req.previous_response_id:
        history = ctx.services.responses.history(req.previous_response_id)
        if history is None:
            raise NotFound(f"previous response {req.previous_response_id!r} was not found "
                           "(it expired, was deleted, or was created with store:false)",
                           param="previous_response_id")
        lead = [m for m in req.messages[:1] if m.role == "system" and body.get("instructions")]
        req = req.replace(messages=(*lead, *parse_input(history), *req.messages[len(lead):]))
    return req


def complete(ctx) -> None:
    final = ctx.turn.extra.get("final")
    if final is not None and ctx.req.store is not False:
        ctx.services.responses.put(ctx.turn.id, input_items=ctx.turn.extra.get("input_items", []),
                                   output_items=final["output"], previous_id=ctx.req.previous_response_id,
                                   response=final)


def stored(services, response_id: str) -> dict:
    body = services.responses.get(response_id)
    if body is None:
        raise NotFound(f"response {response_id!r} was not found")
    return body


def delete_stored(services, response_id: str) -> dict:
    if not services.responses.delete(response_id):
        raise NotFound(f"response {response_id!r} was not found")
    return {"id": response_id, "object": "response", "deleted": True}
