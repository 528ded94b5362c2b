"""/openapi.json built from the msgspec Structs themselves.

quart-schema 0.25 keeps only the first of the schema components msgspec returns for a model
(``list(schema.values())[0]``), so a Struct that nests another (``ErrorResponse`` holds an
``ErrorDetail``) was documented with a dangling ``$ref``, and a model whose nested Struct sorts
first was documented as that nested Struct. This provider keeps the model's own ``$ref`` and
every component it needs. A response Struct with an ``__event_stream__`` attribute (a
description) is documented as ``text/event-stream`` too, for routes that stream on request.
"""

from __future__ import annotations

import inspect
from typing import Any

import msgspec
from quart_schema import OpenAPIProvider
from quart_schema.typing import Model
from quart_schema.validation import DataSource

_REF_TEMPLATE = "#/components/schemas/{name}"
_CONTENT_TYPES = {
    DataSource.JSON: "application/json",
    DataSource.FORM_MULTIPART: "multipart/form-data",
    DataSource.FORM: "application/x-www-form-urlencoded",
}


def _schema(model: type[Model]) -> tuple[dict[str, Any], dict[str, Any]]:
    (schema,), components = msgspec.json.schema_components([model], ref_template=_REF_TEMPLATE)
    return schema, components


class StructOpenAPIProvider(OpenAPIProvider):
    def build_request_body(
        self, model: type[Model], source: DataSource
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        schema, components = _schema(model)
        return {"content": {_CONTENT_TYPES[source]: {"schema": schema}}}, components

    def build_response_object(
        self, model: type[Model], headers_model: type[Model] | None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        if headers_model is not None:
            raise NotImplementedError("response headers are documented in the route's docstring")
        schema, components = _schema(model)
        # ``__doc__`` itself, not inspect.getdoc: that would inherit msgspec.Struct's docstring.
        description = inspect.cleandoc(model.__doc__) if model.__doc__ else model.__name__
        content: dict[str, Any] = {"application/json": {"schema": schema}}
        events = getattr(model, "__event_stream__", None)
        if events:
            # The same route answers a stream (``"stream": true``) as server-sent events.
            # Each event is described as OpenAPI 3.2 does (``data`` and friends of one event).
            event = {
                "type": "object",
                "required": ["data"],
                "properties": {"data": {"type": "string", "description": events}},
            }
            content["text/event-stream"] = {"schema": event}
        response = {"content": content, "description": description}
        return response, components
