"""The published message contract over HTTP (public, no authentication): GET /schemas lists
the JSON Schemas of every message body and the AsyncAPI 3.0 document, GET /schemas/{name}
serves one (exchanges/wire_schemas.py). The schemas' `$ref`s are relative file names, so a
tool that fetched one from /schemas/ resolves the others beside it."""

# No `from __future__ import annotations`: FastAPI reads the route signatures at definition time.
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from exchanges import wire_schemas
from fence import api_models as am
from fence.service import ApiError


def add_schema_routes(app: FastAPI) -> None:
    @app.get("/schemas", tags=["contract"], response_model=None, responses=am.answer(am.SchemaIndex),
             summary="The message schemas (JSON Schema) and the AsyncAPI document (no authentication)")
    async def list_schemas() -> dict[str, Any]:
        files = wire_schemas.names()
        return {"schema_version": wire_schemas.SCHEMA_VERSION,
                "asyncapi": f"/schemas/{wire_schemas.ASYNCAPI}",
                "schemas": {f.removesuffix(".schema.json"): f"/schemas/{f}"
                            for f in files if f.endswith(".schema.json")}}

    @app.get("/schemas/{name}", tags=["contract"], summary="One schema, or the AsyncAPI document",
             description="A JSON Schema (application/schema+json) or the AsyncAPI 3.0 document: a "
                         "document of its own kind, any JSON in this description.")
    async def get_schema(name: str) -> JSONResponse:
        try:
            body = wire_schemas.load(name)
        except KeyError:
            raise ApiError(404, f"no schema {name[:80]!r}: GET /schemas lists them") from None
        media = "application/schema+json" if name.endswith(".schema.json") else "application/json"
        return JSONResponse(body, media_type=media, headers={"Cache-Control": "public, max-age=300"})
