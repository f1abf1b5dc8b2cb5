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
"""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import BaseModel, Field

from provrl.env.search import Hit, SearchBackend, SearchError

MAX_QUERIES = 256
MAX_TOPK = 100


class RetrieveRequest(BaseModel):
    """Body of ``POST /retrieve``."""

    queries: list[str] = Field(..., max_length=MAX_QUERIES, description="Query strings.")
    topk: int | None = Field(None, ge=1, le=MAX_TOPK, description="Results per query.")
    return_scores: bool = Field(False, description="Wrap each document with its score.")


def make_app(backend: SearchBackend, default_topk: int = 3) -> Any:
    """The FastAPI application serving ``backend``."""
    from fastapi import FastAPI, HTTPException

    app = FastAPI(title="provrl search", version="1")

    @app.post("/retrieve")
    def retrieve(req: RetrieveRequest) -> dict[str, Any]:
        k = req.topk or default_topk
        result: list[list[dict[str, Any]]] = []
        for q in req.queries:
            hits = backend.search(q, k)
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

    @app.get("/documents/{doc_id}")
    def document(doc_id: str) -> dict[str, Any]:
        text = backend.open(doc_id)
        if text is None:
            raise HTTPException(status_code=404, detail=f"no document {doc_id!r}")
        return {"id": doc_id, "contents": text}

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "backend": backend.name, "fingerprint": backend.fingerprint()}

    return app


def serve(backend: SearchBackend, host: str = "127.0.0.1", port: int = 8765, topk: int = 3) -> None:
    """Run the service in the foreground (``provrl serve-search``)."""
    import uvicorn

    uvicorn.run(make_app(backend, topk), host=host, port=port, log_level="warning")


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


class HttpSearch:
    """Client backend for any ``/retrieve`` service (Search-R1, FlashRAG, provrl's own)."""

    name = "http-retrieve"

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.Client(timeout=timeout_s)
        self._fingerprint: str | None = None

    def search(self, query: str, k: int) -> list[Hit]:
        try:
            r = self._client.post(
                f"{self.url}/retrieve",
                json={"queries": [query], "topk": k, "return_scores": True},
            )
            r.raise_for_status()
            items = r.json()["result"][0]
        except httpx.TimeoutException as e:
            raise TimeoutError(f"{self.url}/retrieve timed out") from e
        except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as e:
            raise SearchError(f"{self.url}/retrieve failed: {e}") from e
        hits = []
        for it in items:
            if isinstance(it, dict) and "document" in it:
                hits.append(_hit_from_document(it["document"], it.get("score", 0.0)))
            elif isinstance(it, dict):
                hits.append(_hit_from_document(it, 0.0))
        return hits

    def open(self, doc_id: str) -> str | None:
        try:
            r = self._client.get(f"{self.url}/documents/{doc_id.strip()}")
        except httpx.TimeoutException as e:
            raise TimeoutError(f"{self.url}/documents timed out") from e
        except httpx.HTTPError as e:
            raise SearchError(f"{self.url}/documents failed: {e}") from e
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
