"""OpenAI Responses state: stored responses and `previous_response_id`.

    history(services, id, owner)   the items of a stored chain, for the next turn (404 when gone)
    complete(ctx)           once the response is final (the JSON body, or the stream's
                            terminal event): stored with the turn's input items, unless
                            the request said `store: false`
    stored(services, id, owner) / delete_stored(services, id, owner)   GET and DELETE /v1/responses/<id>

owner (proxy.state.store.owner_of) is the hash of the API key the request presented: a
response is stored under its owner, and another owner's id is answered like an unknown one.
"""
from __future__ import annotations

from proxy.errors import NotFound


def history(services, previous_id: str, owner: str) -> list:
    """The stored items of the chain ending at `previous_response_id`, oldest first."""
    items = services.responses.history(previous_id, owner)
    if items is None:
        raise NotFound(f"previous response {previous_id!r} was not found "
                       "(it expired, was deleted, or was created with store:false)",
                       param="previous_response_id")
    return items


def complete(ctx) -> None:
    final = ctx.turn.extra.get("final")
    if final is not None and ctx.req.store is not False:
        ctx.services.responses.put(ctx.turn.id, ctx.owner, input_items=ctx.turn.extra.get("input_items", []),
                                   output_items=final["output"], previous_id=ctx.req.previous_response_id,
                                   response=final)


def stored(services, response_id: str, owner: str) -> dict:
    body = services.responses.get(response_id, owner)
    if body is None:
        raise NotFound(f"response {response_id!r} was not found")
    return body


def delete_stored(services, response_id: str, owner: str) -> dict:
    if not services.responses.delete(response_id, owner):
        raise NotFound(f"response {response_id!r} was not found")
    return {"id": response_id, "object": "response", "deleted": True}
