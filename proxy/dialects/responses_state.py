"""OpenAI Responses state: stored responses and `previous_response_id`.

    history(services, id, owner)   the items of a stored chain, for the next turn (404 when gone)
    complete(ctx)           once the response is final (the JSON body, or the stream's
                            terminal event): stored with the turn's input items, unless
                            the request said `store: false`
    stored(services, id, owner) / delete_stored(services, id, owner)   GET and DELETE /v1/responses/<id>
    input_items(services, id, owner, args)   GET /v1/responses/<id>/input_items, a page of them

owner (proxy.state.store.owner_of) is the hash of the API key the request presented: a
response is stored under its owner, and another owner's id is answered like an unknown one.
"""
from __future__ import annotations

import re

from proxy.errors import InvalidRequest, NotFound


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


def input_items(services, response_id: str, owner: str, args) -> dict:
    """OpenAI's list of a stored response's input items: `order` desc (the default) or asc,
    `limit` 1-100 (20), `after` an item id. Items the client sent without an id get one,
    the same on every read: item_<the response's hex>_<its place>."""
    items = services.responses.input_items(response_id, owner)
    if items is None:
        raise NotFound(f"response {response_id!r} was not found")
    hex_id = response_id.removeprefix("resp_")
    items = [_listed(item, f"item_{hex_id}_{i}") for i, item in enumerate(items)]
    order, limit, after = args.get("order", "desc"), args.get("limit", "20"), args.get("after")
    if order not in ("asc", "desc"):
        raise InvalidRequest("`order` must be 'asc' or 'desc'", param="order")
    if not re.fullmatch(r"[0-9]{1,3}", limit) or not 1 <= int(limit) <= 100:
        raise InvalidRequest("`limit` must be an integer from 1 to 100", param="limit")
    items = items[::-1] if order == "desc" else items
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise InvalidRequest(f"`after` names {after!r}, which is not an input item of this "
                                 "response", param="after")
        items = items[ids.index(after) + 1:]
    page = items[:int(limit)]
    first, last = (page[0]["id"], page[-1]["id"]) if page else (None, None)
    return {"object": "list", "data": page, "first_id": first, "last_id": last,
            "has_more": len(items) > len(page)}


def _listed(item, item_id: str) -> dict:
    """An input item as OpenAI lists it: with an id (its own, when it has one), a message typed
    as one and its text as a part (a bare string in `input` is a user message, as
    openai_responses.parse_input reads it)."""
    if not isinstance(item, dict):
        item = {"type": "message", "role": "user", "content": str(item)}
    own = item.get("id")
    item = {**item, "id": own if isinstance(own, str) and own else item_id}
    if (item.get("type") or ("message" if "role" in item else None)) == "message":
        item["type"] = "message"
        if isinstance(item.get("content"), str):
            part = ({"type": "output_text", "text": item["content"], "annotations": []}
                    if item.get("role") == "assistant" else {"type": "input_text", "text": item["content"]})
            item["content"] = [part]
    return item


def delete_stored(services, response_id: str, owner: str) -> dict:
    if not services.responses.delete(response_id, owner):
        raise NotFound(f"response {response_id!r} was not found")
    return {"id": response_id, "object": "response", "deleted": True}
