"""HTTP retrieval: a FastAPI service speaking the Search-R1 / FlashRAG ``/retrieve`` protocol,
and a client backend for it (so provrl can use retrievers users already run).

Protocol (as in Search-R1's ``retrieval_server.py``)::

    POST /retrieve  {"queries": ["q1", "q2"], "topk": 3, "return_scores": true}
    →   {"result": [[{"document": {"id": "d0000123#0", "contents": "\\"Title\\"\\ntext", ...},
                      "score": 12.3}, ...],            # one list per query
                    ...]}
        (without return_scores each item is the document object itself)

A document's ``contents`` is ``"<title>"\\n<text>`` (the FlashRAG corpus convention); this
service also sends ``doc_id``, ``title`` and ``text`` separately. provrl extensions:
``GET /documents/{doc_id}`` (the ``open`` tool) and ``GET /health``.

**Bounds** (:class:`RetrieveLimits`, each a ``provrl serve-search`` option): a body over
``max_body_bytes`` is refused with 413 before it is read whole; more than ``max_queries``
queries, ``topk`` over ``max_topk``, ``queries × topk`` over ``max_results`` or a query over
``max_query_chars`` characters get 422 naming the field; the backend's own bounds (terms
per query, time budget per query: :class:`~provrl.env.search.QueryError`) answer 422
naming ``queries[i]``; a request still running after ``time_budget_s`` stops with 503; a
body still arriving after ``body_timeout_s`` gets 408 and its connection is closed.

**Strict JSON** (:func:`strict_json`): a body is JSON as RFC 8259 defines it — ``NaN``,
``Infinity`` and numbers too large for a float (``1e400``) get 422 naming the field, as do
malformed or too deeply nested bodies and wrong types; no input answers 500. Every refusal
is one JSON ``detail`` line, and a keep-alive connection stays usable after a rejected
request (only a stalled body's is closed); no request holds a worker past its budget.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel, Field

from provrl.env.search import Hit, QueryError, RetrieveLimits, SearchBackend, SearchError


class RetrieveRequest(BaseModel):
    """Body of ``POST /retrieve`` (its bounds are checked against :class:`RetrieveLimits`)."""

    queries: list[str] = Field(..., description="Query strings.")
    topk: int | None = Field(None, ge=1, description="Results per query.")
    return_scores: bool = Field(False, description="Wrap each document with its score.")


class BodyLimit:
    """ASGI middleware bounding a request body in size and time: 413 for a body over
    ``max_bytes`` — from its Content-Length before reading anything, or while a chunked body
    streams in (the server discards the rest, so the connection stays usable) — and 408,
    closing the connection, for a body not received within ``timeout_s`` of the request's
    start."""

    def __init__(self, app: Any, max_bytes: int, timeout_s: float = 10.0) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.exceptions import HTTPException
        from starlette.responses import JSONResponse

        reason = f"request body larger than {self.max_bytes} bytes"
        too_big = JSONResponse({"detail": reason}, status_code=413)
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await too_big(scope, receive, send)
            return
        seen = 0
        deadline = time.monotonic() + self.timeout_s

        async def bounded() -> Any:
            nonlocal seen
            try:
                message = await asyncio.wait_for(receive(), deadline - time.monotonic())
            except TimeoutError:
                why = f"request body not received within {self.timeout_s:g} s"
                raise HTTPException(408, why, {"connection": "close"}) from None
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise HTTPException(413, reason)
            return message

        await self.app(scope, bounded, send)


class _NonFinite:
    """Where a JSON body held ``NaN``, ``Infinity`` or an overflowing number."""

    def __init__(self, text: str) -> None:
        self.text = text


def _float(text: str) -> Any:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def _first_non_finite(node: Any, path: str) -> tuple[str, str] | None:
    if isinstance(node, _NonFinite):
        return path, node.text
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for k, v in items:
        found = _first_non_finite(v, f"{path}.{k}" if isinstance(k, str) else f"{path}[{k}]")
        if found is not None:
            return found
    return None


class BodyError(ValueError):
    """A request body is not strict JSON; the message names the field or position."""


def strict_json(body: bytes) -> Any:
    """``body`` parsed as strict JSON (RFC 8259): ``NaN``, ``Infinity``, ``-Infinity`` and
    numbers that overflow a float (``1e400``) are :class:`BodyError` naming the field
    (``topk``, ``queries[0]``), as are malformed, too deeply nested or non-UTF-8 bodies."""
    try:
        tree = json.loads(body, parse_constant=_NonFinite, parse_float=_float)
    except json.JSONDecodeError as e:
        raise BodyError(f"body: invalid JSON at character {e.pos}: {e.msg}") from None
    except RecursionError:
        raise BodyError("body: JSON nested too deeply") from None
    except UnicodeDecodeError as e:
        raise BodyError(f"body: not UTF-8 (byte {e.start})") from None
    except ValueError:  # Python's bound on integer digits (sys.get_int_max_str_digits)
        raise BodyError("body: an integer with more digits than a JSON number may have") from None
    try:
        found = _first_non_finite(tree, "")
    except RecursionError:
        raise BodyError("body: JSON nested too deeply") from None
    if found is not None:
        where, text = found
        raise BodyError(f"{where.lstrip('.') or 'body'}: {text} is not a finite JSON number")
    return tree


def _strict_route() -> Any:
    """An ``APIRoute`` whose requests parse their JSON body with :func:`strict_json` (422
    naming the field, instead of Python's lenient ``json.loads``)."""
    from fastapi import HTTPException, Request
    from fastapi.routing import APIRoute

    class StrictRequest(Request):
        async def json(self) -> Any:
            if not hasattr(self, "_json"):
                try:
                    self._json = strict_json(await self.body())
                except BodyError as e:
                    raise HTTPException(422, str(e)) from None
            return self._json

    class StrictRoute(APIRoute):
        def get_route_handler(self) -> Any:
            handler = super().get_route_handler()

            async def strict(request: Request) -> Any:
                return await handler(StrictRequest(request.scope, request.receive))

            return strict

    return StrictRoute


def _one_line(exc: Any) -> str:
    """A request validation error as one line naming the field (no echo of the input)."""
    parts = []
    for e in exc.errors()[:3]:
        loc = [str(x) for x in e.get("loc", ()) if x != "body"]
        parts.append(f"{'.'.join(loc) or 'body'}: {e.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def make_app(
    backend: SearchBackend, default_topk: int = 3, limits: RetrieveLimits | None = None
) -> Any:
    """The FastAPI application serving ``backend`` within ``limits``."""
    from fastapi import FastAPI, HTTPException
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    lim = limits or RetrieveLimits()
    app = FastAPI(title="provrl search", version="1")
    app.router.route_class = _strict_route()
    app.add_middleware(BodyLimit, max_bytes=lim.max_body_bytes, timeout_s=lim.body_timeout_s)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Any, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _one_line(exc)}, status_code=422)

    def check(req: RetrieveRequest, k: int) -> None:
        n = len(req.queries)
        if n > lim.max_queries:
            raise HTTPException(422, f"queries: {n} queries; this server takes {lim.max_queries}")
        if k > lim.max_topk:
            raise HTTPException(422, f"topk: {k}; this server's max_topk is {lim.max_topk}")
        if n * k > lim.max_results:
            raise HTTPException(
                422, f"queries × topk = {n * k} results; this server returns {lim.max_results}"
            )
        for i, q in enumerate(req.queries):
            if len(q) > lim.max_query_chars:
                raise HTTPException(
                    422, f"queries[{i}]: {len(q)} characters; at most {lim.max_query_chars}"
                )

    @app.post("/retrieve")
    def retrieve(req: RetrieveRequest) -> dict[str, Any]:
        k = req.topk or default_topk
        check(req, k)
        deadline = time.monotonic() + lim.time_budget_s
        result: list[list[dict[str, Any]]] = []
        for i, q in enumerate(req.queries):
            if time.monotonic() > deadline:
                raise HTTPException(
                    503,
                    f"request exceeded its time budget of {lim.time_budget_s:g} s after "
                    f"{i} of {len(req.queries)} queries",
                )
            try:
                hits = backend.search(q, k)
            except QueryError as e:
                raise HTTPException(422, f"queries[{i}]: {e}") from None
            except SearchError as e:
                raise HTTPException(503, str(e)) from None
            docs = [
                {
                    "id": h.passage_id,
                    "doc_id": h.doc_id,
                    "title": h.title,
                    "text": h.snippet,
                    "contents": f'"{h.title}"\n{h.snippet}',
                }
                for h in hits
            ]
            if req.return_scores:
                result.append(
                    [{"document": d, "score": h.score} for d, h in zip(docs, hits, strict=True)]
                )
            else:
                result.append(docs)
        return {"result": result}

    @app.get("/documents/{doc_id:path}")
    def document(doc_id: str) -> dict[str, Any]:
        text = backend.open(doc_id)
        if text is None:
            raise HTTPException(status_code=404, detail=f"no document {doc_id!r}")
        return {"id": doc_id, "contents": text}

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "backend": backend.name, "fingerprint": backend.fingerprint()}

    return app


def serve(
    backend: SearchBackend,
    host: str = "127.0.0.1",
    port: int = 8765,
    topk: int = 3,
    limits: RetrieveLimits | None = None,
) -> None:
    """Run the service in the foreground (``provrl serve-search``)."""
    import uvicorn

    uvicorn.run(make_app(backend, topk, limits), host=host, port=port, log_level="warning")


def _hit_from_document(doc: dict[str, Any], score: float) -> Hit:
    pid = str(doc.get("id", ""))
    doc_id, _, para = pid.partition("#")
    doc_id = str(doc.get("doc_id", doc_id))
    title, text = doc.get("title"), doc.get("text")
    if title is None or text is None:
        contents = str(doc.get("contents", ""))
        first, _, rest = contents.partition("\n")
        title, text = first.strip().strip('"'), rest.strip()
    return Hit(doc_id, str(title), str(text), float(score), int(para) if para.isdigit() else 0)


def _detail(r: httpx.Response) -> str:
    """The server's one-line reason (FastAPI's ``detail``), else the start of the body."""
    try:
        d = r.json().get("detail", "")
    except (ValueError, AttributeError):
        d = r.text
    return " ".join(str(d).split())[:300]


RETRY_STATUS = frozenset({429, 502, 503, 504})
"""Answers a retry may cure: rate limited, a proxy without its backend, a service overloaded
or over its own time budget."""


class HttpSearch:
    """Client backend for any ``/retrieve`` service (Search-R1, FlashRAG, provrl's own).

    A request that cannot connect, or is answered with one of :data:`RETRY_STATUS`, is
    retried up to ``retries`` times, after ``backoff_s · 2^i`` seconds before retry i + 1; a
    request that connected and then ran past ``timeout_s`` is not (the query had its time).
    :meth:`check` is the preflight every command runs before any work."""

    name = "http-retrieve"

    def __init__(
        self, url: str, timeout_s: float = 10.0, *, retries: int = 2, backoff_s: float = 0.25
    ) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.Client(timeout=timeout_s)
        self._fingerprint: str | None = None
        self.retries, self.backoff_s = retries, backoff_s
        self.retried = 0
        """Retries made so far (each a failed try that was tried again)."""

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """``method`` on ``url + path`` with the retries of the class docstring; a failure
        that outlasts them raises :class:`SearchError` (``TimeoutError`` for a timeout)."""
        url = f"{self.url}{path}"
        for i in range(self.retries + 1):
            if i:
                self.retried += 1
                time.sleep(self.backoff_s * 2 ** (i - 1))
            try:
                r = self._client.request(method, url, **kw)
            except httpx.ConnectTimeout as e:
                failure = f"{e or 'connect timeout'}"
            except httpx.TimeoutException as e:
                raise TimeoutError(f"{url} timed out") from e
            except httpx.TransportError as e:
                failure = str(e) or type(e).__name__
            except httpx.HTTPError as e:
                raise SearchError(f"{url} failed: {e}") from e
            else:
                if r.status_code not in RETRY_STATUS or i == self.retries:
                    return r
                failure = f"HTTP {r.status_code}: {_detail(r)}"
        tries = f" ({self.retries + 1} tries)" if self.retries else ""
        raise SearchError(f"{url} failed{tries}: {failure}")

    def check(self) -> None:
        """Preflight: the service answers ``GET /health`` (provrl's) or, a server without it
        (Search-R1's), one ``POST /retrieve``; else one :class:`SearchError` line naming the
        URL and what to do."""
        hint = "start the retriever (e.g. provrl serve-search) or fix env.search.url"
        try:
            r = self._request("GET", "/health")
        except (SearchError, TimeoutError) as e:
            raise SearchError(f"search backend {self.url} does not answer: {e}; {hint}") from None
        if r.status_code == 200:
            return
        try:
            self.search("health check", 1)
        except (SearchError, TimeoutError) as e:
            raise SearchError(
                f"search backend {self.url}: GET /health answered HTTP {r.status_code} and "
                f"{e}; {hint}"
            ) from None

    def search(self, query: str, k: int) -> list[Hit]:
        r = self._request(
            "POST", "/retrieve", json={"queries": [query], "topk": k, "return_scores": True}
        )
        if r.status_code in (413, 422):  # the query is out of the server's bounds
            raise QueryError(f"{self.url}/retrieve refused the query: {_detail(r)}")
        if r.status_code >= 400:
            raise SearchError(f"{self.url}/retrieve: HTTP {r.status_code}: {_detail(r)}")
        try:
            items = r.json()["result"][0]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise SearchError(f"{self.url}/retrieve: unexpected response ({e!r})") from e
        hits = []
        for it in items:
            if isinstance(it, dict) and "document" in it:
                hits.append(_hit_from_document(it["document"], it.get("score", 0.0)))
            elif isinstance(it, dict):
                hits.append(_hit_from_document(it, 0.0))
        return hits

    def open(self, doc_id: str) -> str | None:
        r = self._request("GET", f"/documents/{quote(doc_id.strip(), safe='')}")
        if r.status_code == 404:
            return None
        if r.status_code >= 400:
            raise SearchError(f"{self.url}/documents: HTTP {r.status_code}")
        return str(r.json().get("contents", ""))

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            try:
                fp = self._client.get(f"{self.url}/health").json().get("fingerprint", "")
            except (httpx.HTTPError, ValueError):
                fp = ""
            self._fingerprint = f"http:{self.url}:{fp}"
        return self._fingerprint

    def close(self) -> None:
        self._client.close()
