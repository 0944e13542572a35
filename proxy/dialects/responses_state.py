"""OpenAI Responses state: stored responses and `previous_response_id`.

    history(services, id)   the items of a stored chain, for the next turn (404 when gone)
    complete(ctx)           once the response is final (the JSON body, or the stream's
                            terminal event): stored with the turn's input items, unless
                            the request said `store: false`
    stored(services, id) / delete_stored(services, id)   GET and DELETE /v1/responses/<id>
"""
from __future__ import annotations

from proxy.errors import NotFound


def history(services, previous_id: str) -> list:
    """The stored items of the chain ending at `previous_response_id`, oldest first."""
    items = services.responses.history(previous_id)
    if items is None:
        raise NotFound(f"previous response {previous_id!r} was not found "
                       "(it expired, was deleted, or was created with store:false)",
                       param="previous_response_id")
    return items


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
