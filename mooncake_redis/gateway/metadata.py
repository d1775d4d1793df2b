"""The transfer engine's HTTP metadata server, as Mooncake's master serves it with
--enable_http_metadata_server, kept in the store (mc_gw_metadata_*): a key-value store at
/metadata?key=<key> (GET, PUT, DELETE; bodies opaque), /health, Mooncake's admin segment
queries /get_all_segments and /query_segment, and RFC 000's active invalidation POST
/v1/cache/evict. A small HTTP/1.1 server on asyncio streams (keep-alive,
Content-Length bodies); every store call runs on the gateway's thread pool."""
from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qs, urlsplit

from ..config import NAME_RE
from ..errors import MasterError
from .store import GatewayStore

log = logging.getLogger("mooncake_redis.gateway")

MAX_HEADER = 16 << 10  # bytes of a request line and its headers
MAX_BODY = 1 << 20     # as mc_gw_metadata_put's value limit
MAX_PREFIXES = 4096    # prefix hashes in one /v1/cache/evict
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 411: "Length Required",
           413: "Payload Too Large", 500: "Internal Server Error", 501: "Not Implemented"}
HEX_HASH = re.compile(r"[0-9a-f]{1,128}")

Run = Callable[..., Awaitable[Any]]  # runs a blocking call on the gateway's thread pool


class HttpError(Exception):
    def __init__(self, status: int, text: str):
        self.status, self.text = status, text


def response(status: int, body: bytes, content_type: str | None = None, close: bool = False) -> bytes:
    head = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}", "Server: mooncake-redis",
            f"Content-Length: {len(body)}"]
    if content_type:
        head.append(f"Content-Type: {content_type}")
    if close:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class MetadataServer:
    def __init__(self, store: GatewayStore, run: Run, on_request: Callable[[str, int], None] | None = None):
        self.store = store
        self.run = run
        self.on_request = on_request or (lambda route, status: None)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.LimitOverrunError:
                    writer.write(response(400, b"request header too large", close=True))
                    break
                except asyncio.IncompleteReadError:
                    break
                if len(head) > MAX_HEADER:
                    writer.write(response(400, b"request header too large", close=True))
                    break
                try:
                    method, target, version, headers = self._parse_head(head)
                    length = int(headers.get("content-length", "0"))
                    if "chunked" in headers.get("transfer-encoding", ""):
                        raise HttpError(411, "chunked bodies are not supported: send Content-Length")
                    if length < 0 or length > MAX_BODY:
                        raise HttpError(413, f"body larger than {MAX_BODY} bytes")
                except ValueError:
                    writer.write(response(400, b"malformed request", close=True))
                    break
                except HttpError as exc:
                    writer.write(response(exc.status, exc.text.encode(), close=True))
                    break
                body = await reader.readexactly(length) if length else b""
                close = version == "HTTP/1.0" or headers.get("connection", "").lower() == "close"
                writer.write(await self._answer(method, target, body, close))
                await writer.drain()
                if close:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        return method, target, version, headers

    async def _answer(self, method: str, target: str, body: bytes, close: bool) -> bytes:
        url = urlsplit(target)
        try:
            if url.path == "/metadata":
                status, text, ctype = await self._metadata(method, url.query, body)
            elif url.path == "/health":
                status, text, ctype = 200, b"OK", None
            elif url.path in ("/get_all_segments", "/query_segment"):
                if method != "GET":
                    raise HttpError(405, "use GET")
                status, text, ctype = await self._segments(url.path, url.query)
            elif url.path == "/v1/cache/evict":
                if method != "POST":
                    raise HttpError(405, "use POST")
                status, text, ctype = 200, await self._evict(body), "application/json"
            else:
                raise HttpError(404, "not found")
        except HttpError as exc:
            status, text, ctype = exc.status, exc.text.encode(), None
        except MasterError as exc:
            log.warning("metadata %s %s: %s", method, url.path, exc)
            status, text, ctype = 500, str(exc).encode(), None
        self.on_request(url.path, status)
        return response(status, text, ctype, close)

    async def _metadata(self, method: str, query: str, body: bytes) -> tuple[int, bytes, str | None]:
        keys = parse_qs(query, keep_blank_values=True).get("key", [""])
        key = keys[0].encode()
        if not key:
            raise HttpError(400, "Missing key parameter")
        if len(key) > 1024:
            raise HttpError(400, "key longer than 1024 bytes")
        if method == "GET":
            value = await self.run(self.store.metadata_get, key)
            if value is None:
                return 404, b"metadata not found", None
            return 200, value, "application/json"
        if method == "PUT":
            outcome = await self.run(self.store.metadata_put, key, body)
            if outcome == "duplicate":
                return 400, b"Duplicate rpc_meta key not allowed", None
            return 200, f"metadata {outcome}".encode(), None
        if method == "DELETE":
            if await self.run(self.store.metadata_delete, key):
                return 200, b"metadata deleted", None
            return 404, b"metadata not found", None
        raise HttpError(405, "Method not allowed")

    async def _segments(self, path: str, query: str) -> tuple[int, bytes, str | None]:
        """Mooncake's admin queries, in its text format: /get_all_segments (one name a line) and
        /query_segment?segment=<name> ("<name>\\nUsed(bytes): U\\nCapacity(bytes) : C\\n"; an
        unknown segment is Mooncake's 500 "Failed to query segment")."""
        master, ctype = self.store.master, "text/plain; version=0.0.4"
        if path == "/get_all_segments":
            names = await self.run(master.segment_names)
            return 200, "".join(f"{n}\n" for n in names).encode("utf-8", "surrogateescape"), ctype
        name = parse_qs(query, keep_blank_values=True).get("segment", [""])[0]
        found = await self.run(master.segment_usage, name) if 1 <= len(name.encode()) <= 1024 else None
        if found is None:
            return 500, b"Failed to query segment", ctype
        used, capacity = found
        return 200, f"{name}\nUsed(bytes): {used}\nCapacity(bytes) : {capacity}\n".encode(), ctype

    async def _evict(self, body: bytes) -> bytes:
        """RFC 000's active invalidation: end the guarantees of a tenant's objects under these
        prefix hashes (Master.expire_guaranteed)."""
        try:
            request = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise HttpError(400, "the body must be JSON: {\"prefix_hashes\": [...], \"tenant_id\": \"...\"}") from None
        if not isinstance(request, dict) or not isinstance(request.get("prefix_hashes"), list):
            raise HttpError(400, "prefix_hashes must be a list of hex strings")
        hashes, tenant = request["prefix_hashes"], request.get("tenant_id", "default")
        if not isinstance(tenant, str) or not NAME_RE.fullmatch(tenant):
            raise HttpError(400, "tenant_id must match [A-Za-z0-9_.-]{1,64}")
        if not 1 <= len(hashes) <= MAX_PREFIXES:
            raise HttpError(400, f"prefix_hashes must hold 1-{MAX_PREFIXES} entries")
        bad = [h for h in hashes if not isinstance(h, str) or not HEX_HASH.fullmatch(h)]
        if bad:
            raise HttpError(400, f"not a lowercase hex prefix hash: {bad[0]!r}")
        ended = await self.run(self.store.master.expire_guaranteed, hashes, tenant)
        return json.dumps({"tenant_id": tenant, "expired": dict(zip(hashes, ended)),
                           "total": sum(ended)}).encode()
