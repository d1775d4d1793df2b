"""Explicit context caching, engine side: from a chat request's `cache_control` markers to the
store keys of the KV pages they cover, and the puts and reads that carry the guarantee.

Three steps, each usable alone:

1. Marks. `prompt_marks(messages, tokenize)` renders chat messages (OpenAI or Anthropic format)
   to token ids and finds, for every part marked `cache_control: {"type": "ephemeral"}` (with an
   optional `"ttl": "5m" | "1h"`, default 5m), the token offset where the marked prefix ends and
   its TTL in ms.
2. Page keys. `sglang_page_hashes` (SGLang HiCache's SHA-256 chain) and `blake3_page_hashes`
   hash whole pages of `page_size` tokens, each page chained to the one before; `page_key`
   prefixes a hash with a model tag the way SGLang's Mooncake backend does.
3. Pages in the store. `page_ttls` gives every whole page the guarantee of the marks that cover
   it (a page is covered when it ends at or before a mark's offset); `prompt_pages` ties keys and
   TTLs together; `put_start_pages` and `read_pages` call a `Master` with the matching
   `guaranteed_ttl_ms`; `guarantee_cached_pages` guarantees marked pages that are already cached
   (first written without a mark), which put_start_pages does for such keys by default.

Example (ChatML template, a HuggingFace tokenizer, SGLang HiCache keys with 64-token pages)::

    render = functools.partial(render_segments,
                               message_start=lambda role: f"<|im_start|>{role}\\n",
                               message_end="<|im_end|>\\n")
    prompt = prompt_marks(messages, lambda s: tok.encode(s, add_special_tokens=False), render=render)
    pages = prompt_pages(prompt.token_ids, prompt.marks, 64, model="Qwen/Qwen3-8B",
                         suffixes=("_0_k", "_0_v"))
    results = put_start_pages(master, "engine-0", pages, page_bytes)
    # ... transfer the KV bytes to the replicas, then:
    master.batch_put_end("engine-0", pages.keys)
    # later requests with the same prefix:
    read = read_pages(master, pages)   # read.hit_pages leading pages are in the store
"""
from __future__ import annotations

import dataclasses
import hashlib
import struct
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from .config import ReplicateConfig
from .errors import ErrorCode

TTL_MS = {"5m": 5 * 60 * 1000, "1h": 60 * 60 * 1000}  # the TTLs cache_control may name
DEFAULT_TTL = "5m"
MAX_TOKEN_ID = 2**32 - 1  # page hashes take each token id as 4 bytes, unsigned

Segment = tuple[str, "Mapping[str, Any] | None"]  # (text, the cache_control that ends here)


# ---- 1. marks ------------------------------------------------------------------------------
@dataclass(frozen=True)
class CacheMark:
    end: int     # tokens [0, end) of the prompt are the marked prefix
    ttl_ms: int


@dataclass(frozen=True)
class MarkedPrompt:
    token_ids: list[int]
    marks: list[CacheMark]  # in prompt order, so `end` never decreases


def cache_control_ttl_ms(cache_control: Any) -> int:
    """The TTL in ms that a `cache_control` value asks for: `{"type": "ephemeral"}` is 5 minutes,
    `"ttl": "5m"` or `"1h"` choose. Anything else (another type, another TTL, an unknown field,
    not a dict) is a ValueError saying what was wrong."""
    if not isinstance(cache_control, Mapping):
        raise ValueError(f"cache_control must be an object, not {cache_control!r}")
    unknown = sorted(set(cache_control) - {"type", "ttl"}, key=str)
    if unknown:
        raise ValueError(f"cache_control has unknown fields {unknown}: only type and ttl")
    if cache_control.get("type") != "ephemeral":
        raise ValueError(f'cache_control type must be "ephemeral", not {cache_control.get("type")!r}')
    ttl = cache_control.get("ttl", DEFAULT_TTL)
    if not isinstance(ttl, str) or ttl not in TTL_MS:
        raise ValueError(f'cache_control ttl must be one of {sorted(TTL_MS)}, not {ttl!r}')
    return TTL_MS[ttl]


def _text_blocks(content: Any, where: str) -> Iterator[Segment]:
    """A message's (or Anthropic system's) content: a string, None (an assistant turn that only
    calls tools) or a list of text blocks, each with an optional cache_control."""
    if content is None:
        return
    if isinstance(content, str):
        yield content, None
        return
    if not isinstance(content, list):
        raise ValueError(f"{where}: content must be a string or a list of blocks")
    for i, block in enumerate(content):
        if not isinstance(block, Mapping) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
            raise ValueError(f"{where} block {i}: only text blocks render to text, not {kind!r} "
                             "(render other blocks with your own render=)")
        yield block["text"], block.get("cache_control")


def render_segments(messages: Sequence[Mapping[str, Any]], system: Any = None, *,
                    message_start: Callable[[str], str] = lambda role: "",
                    message_end: str = "") -> Iterator[Segment]:
    """The default renderer: the prompt as text segments in order, each with the cache_control
    that ends at its end (or None).

    Anthropic's top-level `system` (a string or text blocks) comes first as a "system" message.
    Each message is `message_start(role)`, its content blocks, then `message_end`; a
    cache_control on a block ends the marked prefix right after that block's text, and one on
    the message itself (as some OpenAI-compatible servers accept) after `message_end`. With the
    defaults the prompt is the blocks' texts joined with nothing between them; pass the pieces of
    your chat template (e.g. ChatML: `lambda role: f"<|im_start|>{role}\\n"` and
    `"<|im_end|>\\n"`) to render what the model sees. Tool definitions (Anthropic's `tools`) and
    blocks other than text are left to a `render` of your own, which yields them as text segments
    with their cache_control."""
    turns: list[tuple[str, Any, Any]] = []
    if system is not None:
        turns.append(("system", system, None))
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ValueError(f"message {i} must be an object with a string role")
        turns.append((message["role"], message.get("content"), message.get("cache_control")))
    for n, (role, content, message_mark) in enumerate(turns):
        yield message_start(role), None
        yield from _text_blocks(content, f"{role} message {n}")
        yield message_end, message_mark


def _tokens(tokenize: Callable[[str], Sequence[int]], text: str) -> list[int]:
    ids = list(tokenize(text)) if text else []
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= MAX_TOKEN_ID:
            raise ValueError(f"tokenize returned {t!r}: token ids must be integers in [0, 2**32)")
    return ids


def prompt_marks(messages: Sequence[Mapping[str, Any]], tokenize: Callable[[str], Sequence[int]], *,
                 system: Any = None,
                 render: Callable[[Sequence[Mapping[str, Any]], Any], Iterable[Segment]] = render_segments,
                 ) -> MarkedPrompt:
    """The prompt's token ids and, per cache_control marker, where its prefix ends and its TTL.

    Rendering contract: `render(messages, system)` yields `(text, cache_control or None)` pairs in
    prompt order (`render_segments` by default; wrap it with functools.partial for a chat
    template, or write your own). The texts between two marks are joined and tokenized with
    `tokenize` (text -> token ids; it must not add special tokens such as BOS: put those in the
    template), and the token ids of these pieces are concatenated, so every mark falls exactly on
    a token boundary. The engine must then run the model on exactly `token_ids` (SGLang's
    `input_ids`, vLLM's `prompt_token_ids`) for its cached pages to match these offsets; the ids
    can differ from tokenizing the whole text at once only across a mark (no merge is made
    there). Marks keep their order; two marks at the same place are both kept."""
    token_ids: list[int] = []
    marks: list[CacheMark] = []
    pending: list[str] = []
    for segment in render(messages, system):
        text, cache_control = segment
        if not isinstance(text, str):
            raise ValueError(f"render yielded {type(text).__name__} text: segments are (str, cache_control)")
        pending.append(text)
        if cache_control is not None:
            ttl_ms = cache_control_ttl_ms(cache_control)
            token_ids.extend(_tokens(tokenize, "".join(pending)))
            pending.clear()
            marks.append(CacheMark(len(token_ids), ttl_ms))
    token_ids.extend(_tokens(tokenize, "".join(pending)))
    return MarkedPrompt(token_ids, marks)


# ---- 2. page hashes and keys ---------------------------------------------------------------
def _whole_pages(token_ids: Sequence[int], page_size: int) -> Iterator[bytes]:
    """Each whole page's token ids as 4-byte little-endian unsigned integers; a trailing partial
    page has no key (the engines store whole pages only)."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be a positive integer, not {page_size!r}")
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        page = token_ids[start:start + page_size]
        try:
            yield struct.pack(f"<{page_size}I", *page)
        except struct.error:
            raise ValueError("token ids must be integers in [0, 2**32)") from None


def sglang_page_hashes(token_ids: Sequence[int], page_size: int, prior_hash: str | None = None) -> list[str]:
    """SGLang HiCache's page hashes (`get_hash_str` over each page, chained as its
    `get_hash_list` does): page i is SHA-256 of the previous page's hash (its 32 bytes, from the
    hex string; nothing for the first page, nor when `prior_hash` is None or "") followed by the
    page's token ids, each as 4 bytes little-endian unsigned; lower-case hex (64 characters).
    `prior_hash` continues a chain after pages already hashed. SGLang's EAGLE bigram tokens
    (tuples) are not supported."""
    hashes: list[str] = []
    prev = prior_hash
    for page in _whole_pages(token_ids, page_size):
        h = hashlib.sha256()
        if prev:
            h.update(bytes.fromhex(prev))
        h.update(page)
        prev = h.hexdigest()
        hashes.append(prev)
    return hashes


def blake3_page_hashes(token_ids: Sequence[int], page_size: int, prior_hash: str | None = None) -> list[str]:
    """Page hashes for Mooncake's radix index, which keys prefixes by blake3 hashes
    (kvcache-ai/Mooncake#1998) without fixing the bytes hashed; they are fixed here as the
    SHA-256 chain's layout with blake3 in its place: page i is blake3 of the previous page's
    32-byte hash (from the hex; nothing for the first page or an empty `prior_hash`) followed by
    the page's token ids as 4-byte little-endian unsigned integers; the 32-byte digest in
    lower-case hex (64 characters)."""
    from blake3 import blake3  # imported here: the other steps need nothing beyond the stdlib

    hashes: list[str] = []
    prev = prior_hash
    for page in _whole_pages(token_ids, page_size):
        h = blake3()
        if prev:
            h.update(bytes.fromhex(prev))
        h.update(page)
        prev = h.hexdigest()
        hashes.append(prev)
    return hashes


PAGE_HASHES = {"sglang": sglang_page_hashes, "blake3": blake3_page_hashes}


def model_tag(model: str | None = None, backend_tag: str | None = None) -> str | None:
    """The key prefix of SGLang's Mooncake backend (`config_prefix`, SGLang 0.5.17 and later):
    the backend tag, then the model name with "/" replaced by "-", joined by "_"; None when
    neither is given."""
    parts = [] if backend_tag is None else [str(backend_tag)]
    if model:
        parts.append("-".join(model.split("/")))
    return "_".join(parts) if parts else None


def page_key(page_hash: str, tag: str | None = None, suffix: str = "") -> str:
    """An object key as SGLang's Mooncake backend writes it: `<tag>_<hash><suffix>`, or
    `<hash><suffix>` without a tag; the suffix names the part of the page (e.g. "_0_k" and
    "_0_v", tensor-parallel rank 0, for an MHA model's K and V; "__k" for MLA).
    With the default key profile ("sglang", docs/engines.md) the store takes the page hash out
    of every such key, tagged or not, so all parts of a page route to one shard, index under
    one radix node and `expire_guaranteed` of that hash reaches them (see keys.routing_part)."""
    return f"{tag}_{page_hash}{suffix}" if tag else f"{page_hash}{suffix}"


# ---- 3. pages in the store -----------------------------------------------------------------
def page_ttls(num_pages: int, page_size: int, marks: Sequence[CacheMark]) -> list[int]:
    """Per page, the guaranteed TTL in ms (0: none). Page i covers tokens
    [i * page_size, (i + 1) * page_size) and is inside a mark's prefix iff it ends at or before
    the mark's `end` (only whole pages: a page the mark cuts is not guaranteed); a page inside
    several prefixes takes the longest TTL among them."""
    ttls = [0] * num_pages
    for mark in marks:
        for i in range(min(num_pages, mark.end // page_size)):
            ttls[i] = max(ttls[i], mark.ttl_ms)
    return ttls


@dataclass(frozen=True)
class PromptPages:
    """The store objects of a prompt's whole pages: `keys` in page order with `per_page`
    consecutive keys per page (one per suffix), and each key's guaranteed TTL (0: ordinary)."""
    keys: list[str]
    ttl_ms: list[int]
    per_page: int = 1

    @property
    def pages(self) -> int:
        return len(self.keys) // self.per_page


def prompt_pages(token_ids: Sequence[int], marks: Sequence[CacheMark], page_size: int, *,
                 scheme: str = "sglang", model: str | None = None, backend_tag: str | None = None,
                 suffixes: Sequence[str] = ("",), prior_hash: str | None = None) -> PromptPages:
    """Keys and TTLs of every whole page of `token_ids`: hashes by `scheme` ("sglang" or
    "blake3"), keys by `page_key` with the tag of `model` and `backend_tag`, one key per suffix."""
    if scheme not in PAGE_HASHES:
        raise ValueError(f"scheme must be one of {sorted(PAGE_HASHES)}, not {scheme!r}")
    if not suffixes:
        raise ValueError("suffixes must name at least one key per page ('' for the bare hash)")
    hashes = PAGE_HASHES[scheme](token_ids, page_size, prior_hash)
    tag = model_tag(model, backend_tag)
    ttls = page_ttls(len(hashes), page_size, marks)
    return PromptPages(keys=[page_key(h, tag, s) for h in hashes for s in suffixes],
                       ttl_ms=[t for t in ttls for _ in suffixes], per_page=len(suffixes))


def _by_ttl(ttls: Sequence[int]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for i, ttl in enumerate(ttls):
        groups.setdefault(ttl, []).append(i)
    return groups


def guarantee_cached_pages(master: Any, pages: PromptPages, keys: Sequence[int] | None = None,
                           tenant_id: str = "default") -> list[Any]:
    """Guarantee the marked pages' objects that are already in the store (`Master.guarantee_cached`,
    one call per distinct TTL): a prefix first cached without a mark becomes guaranteed when a
    marked request covers it, bounded by the same guaranteed-capacity limit as a guaranteed put
    (reads stay renew-only). `keys`: the indexes of `pages.keys` to take (default: all).
    Returns per key, in key order: None for a key outside a mark (or not taken), else the
    guarantee's deadline (ms) or an ErrorCode (OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY,
    GUARANTEED_CAPACITY_EXCEEDED)."""
    chosen = range(len(pages.keys)) if keys is None else keys
    out: list[Any] = [None] * len(pages.keys)
    for ttl, idx in _by_ttl([pages.ttl_ms[i] for i in chosen]).items():
        if not ttl:
            continue
        picked = [chosen[j] for j in idx]
        for i, result in zip(picked, master.guarantee_cached([pages.keys[i] for i in picked], ttl,
                                                             tenant_id=tenant_id)):
            out[i] = result
    return out


def put_start_pages(master: Any, client_id: str, pages: PromptPages, sizes: int | Sequence[int], *,
                    config: ReplicateConfig | None = None, guarantee_fallback: bool = True,
                    guarantee_cached: bool = True, tenant_id: str = "default") -> list[Any]:
    """`batch_put_start` of every object of `pages`, one call per distinct TTL: guaranteed keys
    with `config` (default ReplicateConfig()) given `guaranteed_ttl_ms=ttl` and
    `guarantee_fallback`, the others with `config` as it is. By default a guaranteed key past
    the guaranteed-capacity limit is written as an ordinary object (RFC 000: the write falls back
    to a normal put, so the limit never blocks a write); `guarantee_fallback=False` gets
    GUARANTEED_CAPACITY_EXCEEDED for it instead. `sizes`: one size for all objects
    or one per key. Returns per key, in key order, its replicas or an ErrorCode. A marked key
    already in the store (OBJECT_ALREADY_EXISTS: nothing to write) is guaranteed in place with
    `guarantee_cached_pages` unless `guarantee_cached=False` (its entry stays
    OBJECT_ALREADY_EXISTS; call guarantee_cached_pages for its outcome). Ending the puts
    after the data transfer is the caller's: `master.batch_put_end(client_id, pages.keys,
    tenant_id=...)` (or `batch_put_revoke` for a failed transfer)."""
    per_key = [sizes] * len(pages.keys) if isinstance(sizes, int) else list(sizes)
    if len(per_key) != len(pages.keys):
        raise ValueError(f"{len(per_key)} sizes for {len(pages.keys)} keys")
    base = config or ReplicateConfig()
    out: list[Any] = [None] * len(pages.keys)
    for ttl, idx in _by_ttl(pages.ttl_ms).items():
        cfg = (dataclasses.replace(base, guaranteed_ttl_ms=ttl, guarantee_fallback=guarantee_fallback)
               if ttl else config)
        results = master.batch_put_start(client_id, [pages.keys[i] for i in idx], [per_key[i] for i in idx],
                                         cfg, tenant_id=tenant_id)
        for i, result in zip(idx, results):
            out[i] = result
    cached = [i for i, r in enumerate(out) if pages.ttl_ms[i] and r == ErrorCode.OBJECT_ALREADY_EXISTS]
    if guarantee_cached and cached:
        guarantee_cached_pages(master, pages, cached, tenant_id=tenant_id)
    return out


@dataclass(frozen=True)
class PagesRead:
    results: list[Any]  # per key, in key order: a ReplicaListResult or an ErrorCode
    hit_pages: int      # the leading pages whose every object was found (usable prefix)


def read_pages(master: Any, pages: PromptPages, tenant_id: str = "default") -> PagesRead:
    """`batch_get_replica_list` of every object of `pages`, one call per distinct TTL: keys of a
    marked page pass `guaranteed_ttl_ms=ttl` (renewing a guarantee that is still active, as a
    cache hit refreshes it; an expired or absent one stays so), the others read plainly. Every
    key found is leased, also past the first miss; `hit_pages` counts the leading pages that are
    whole in the store."""
    out: list[Any] = [None] * len(pages.keys)
    for ttl, idx in _by_ttl(pages.ttl_ms).items():
        keys = [pages.keys[i] for i in idx]
        results = (master.batch_get_replica_list(keys, tenant_id=tenant_id, guaranteed_ttl_ms=ttl) if ttl
                   else master.batch_get_replica_list(keys, tenant_id=tenant_id))
        for i, result in zip(idx, results):
            out[i] = result
    found = [not isinstance(r, ErrorCode) for r in out]
    hit = 0
    while hit < pages.pages and all(found[hit * pages.per_page:(hit + 1) * pages.per_page]):
        hit += 1
    return PagesRead(out, hit)
