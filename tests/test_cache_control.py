"""The engine side of explicit context caching (mooncake_redis.cache_control), without a store:
cache_control parsing, token offsets of marked prefixes, page hash chains, page selection, and
how the read helper groups keys and counts hits."""
from __future__ import annotations

import functools
import hashlib
import re

import pytest
from blake3 import blake3
from hypothesis import given, settings
from hypothesis import strategies as st

from mooncake_redis import ErrorCode
from mooncake_redis.cache_control import (
    CacheMark, PromptPages, blake3_page_hashes, cache_control_ttl_ms, model_tag, page_key, page_ttls,
    prompt_marks, prompt_pages, read_pages, render_segments, sglang_page_hashes)
from mooncake_redis.keys import KEY_PROFILES, routing_part

FIVE_MIN, ONE_HOUR = 300_000, 3_600_000
EPHEMERAL = {"type": "ephemeral"}


def byte_tokens(text: str) -> list[int]:
    """A tokenizer whose ids are the UTF-8 bytes: offsets are easy to state by hand."""
    return list(text.encode())


CHATML = functools.partial(render_segments, message_start=lambda role: f"<|im_start|>{role}\n",
                           message_end="<|im_end|>\n")


# ---- cache_control -------------------------------------------------------------------------
def test_ttl_default_and_named():
    assert cache_control_ttl_ms({"type": "ephemeral"}) == FIVE_MIN
    assert cache_control_ttl_ms({"type": "ephemeral", "ttl": "5m"}) == FIVE_MIN
    assert cache_control_ttl_ms({"type": "ephemeral", "ttl": "1h"}) == ONE_HOUR


@pytest.mark.parametrize("value, message", [
    ({"type": "persistent"}, "ephemeral"),
    ({}, "ephemeral"),
    ({"type": "ephemeral", "ttl": "10m"}, "ttl"),
    ({"type": "ephemeral", "ttl": 300}, "ttl"),
    ({"type": "ephemeral", "ttl": ["5m"]}, "ttl"),
    ({"type": "ephemeral", "ttl": None}, "ttl"),
    ({"type": "ephemeral", "scope": "global"}, "unknown fields"),
    ("ephemeral", "object"),
    (True, "object"),
])
def test_ttl_errors(value, message):
    with pytest.raises(ValueError, match=message):
        cache_control_ttl_ms(value)


# ---- marks ---------------------------------------------------------------------------------
def test_openai_strings_without_marks():
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    prompt = prompt_marks(messages, byte_tokens)
    assert prompt.token_ids == byte_tokens("be briefhi")
    assert prompt.marks == []


def test_anthropic_blocks_offsets_and_ttls():
    system = [{"type": "text", "text": "You are a lawyer.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    messages = [
        {"role": "user", "content": [
            {"type": "text", "text": "<contract>", "cache_control": EPHEMERAL},
            {"type": "text", "text": " What is clause 3?"}]},
    ]
    prompt = prompt_marks(messages, byte_tokens, system=system)
    assert prompt.token_ids == byte_tokens("You are a lawyer.<contract> What is clause 3?")
    assert prompt.marks == [CacheMark(len("You are a lawyer."), ONE_HOUR),
                            CacheMark(len("You are a lawyer.<contract>"), FIVE_MIN)]


def test_chat_template_pieces_count_before_the_mark_and_not_after():
    messages = [{"role": "system", "content": [{"type": "text", "text": "SYS", "cache_control": EPHEMERAL}]},
                {"role": "user", "content": "Q"}]
    prompt = prompt_marks(messages, byte_tokens, render=CHATML)
    text = "<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
    assert prompt.token_ids == byte_tokens(text)
    assert prompt.marks == [CacheMark(len("<|im_start|>system\nSYS"), FIVE_MIN)]


def test_message_level_mark_ends_after_the_message():
    messages = [{"role": "user", "content": "doc", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
                {"role": "assistant", "content": None},
                {"role": "user", "content": "more"}]
    prompt = prompt_marks(messages, byte_tokens, render=CHATML)
    assert prompt.marks == [CacheMark(len("<|im_start|>user\ndoc<|im_end|>\n"), ONE_HOUR)]
    assert prompt.token_ids == byte_tokens(
        "<|im_start|>user\ndoc<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n")


def test_text_is_tokenized_in_one_piece_between_marks():
    calls = []

    def tokenize(text):
        calls.append(text)
        return byte_tokens(text)

    messages = [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b", "cache_control": EPHEMERAL},
        {"type": "text", "text": "c"}]}, {"role": "user", "content": "d"}]
    prompt_marks(messages, tokenize, render=CHATML)
    assert calls == ["<|im_start|>user\nab", "c<|im_end|>\n<|im_start|>user\nd<|im_end|>\n"]


@pytest.mark.parametrize("messages, message", [
    ([{"role": "user", "content": [{"type": "image", "source": {}}]}], "image"),
    ([{"role": "user", "content": ["plain string in a list"]}], "str"),
    ([{"role": "user", "content": {"type": "text", "text": "x"}}], "string or a list"),
    ([{"content": "no role"}], "role"),
    (["not a message"], "role"),
    ([{"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "2h"}}]}],
     "ttl"),
])
def test_bad_messages(messages, message):
    with pytest.raises(ValueError, match=message):
        prompt_marks(messages, byte_tokens)


@pytest.mark.parametrize("bad", [[-1], [2**32], [1.5], [True]])
def test_tokenizer_output_checked(bad):
    with pytest.raises(ValueError, match="token ids"):
        prompt_marks([{"role": "user", "content": "x"}], lambda text: bad)


def test_custom_render():
    def render(messages, system):
        yield "<s>", None
        for m in messages:
            yield m["text"], m.get("mark")

    prompt = prompt_marks([{"text": "abc", "mark": EPHEMERAL}, {"text": "de"}], byte_tokens, render=render)
    assert prompt.marks == [CacheMark(6, FIVE_MIN)] and len(prompt.token_ids) == 8


def test_render_must_yield_text_and_a_null_mark_is_no_mark():
    with pytest.raises(ValueError, match="segments are"):
        prompt_marks([], byte_tokens, render=lambda messages, system: iter([(b"bytes", None)]))
    messages = [{"role": "user", "content": [{"type": "text", "text": "x", "cache_control": None}]}]
    assert prompt_marks(messages, byte_tokens).marks == []


segments = st.lists(st.tuples(st.text(max_size=8), st.none() | st.sampled_from(
    [EPHEMERAL, {"type": "ephemeral", "ttl": "5m"}, {"type": "ephemeral", "ttl": "1h"}])), max_size=12)


@settings(max_examples=200, deadline=None)
@given(segments)
def test_mark_offsets_are_the_tokens_before_them(segs):
    """With a tokenizer that commutes with concatenation, each mark's end is the token count of
    the text before it, and the token ids are those of the whole text."""
    prompt = prompt_marks([], byte_tokens, render=lambda messages, system: iter(segs))
    assert prompt.token_ids == byte_tokens("".join(text for text, _ in segs))
    expected, seen = [], ""
    for text, mark in segs:
        seen += text
        if mark is not None:
            expected.append(CacheMark(len(seen.encode()), cache_control_ttl_ms(mark)))
    assert prompt.marks == expected
    assert all(a.end <= b.end for a, b in zip(prompt.marks, prompt.marks[1:]))


# ---- page hashes ---------------------------------------------------------------------------
def reference_chain(hash_fn, tokens, page_size, prior=None):
    """The chain as SGLang's get_hash_str states it, token by token, whole pages only."""
    out, prev = [], prior
    for p in range(len(tokens) // page_size):
        h = hash_fn()
        if prev:
            h.update(bytes.fromhex(prev))
        for t in tokens[p * page_size:(p + 1) * page_size]:
            h.update(t.to_bytes(4, byteorder="little", signed=False))
        prev = h.hexdigest()
        out.append(prev)
    return out


# Vectors: (tokens, page size, expected SHA-256 chain, expected blake3 chain).
VECTORS = [
    ([1, 2, 3, 4, 5, 6, 7, 8, 9], 4,
     ["cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72",
      "4ebfa8a1f3c341517621838c6e1b9aa350307e3f00b3cbd1a07ef740f54396d6"],
     ["ca296c6a3240cd16ca5fab77beabd9870dabd5e2f11cf969337d6b15b3e660cc",
      "d4db25e68deeeca5932bd991dcc91b8b68fddd9eedf4ddfa149d8c74490b5103"]),
    ([0, 2**32 - 1, 151643, 42], 2,
     ["5981693c8df83eea16da42a0f748facb299546688544a0c2887ed5ffbf086e86",
      "16b191bb3cadfb1418bf486b877896f1ca1a8ced5bc8d6e75af5beaf04629655"],
     ["e4772e33308da0d779a6c49225c132bfa1f6227396386f2b5bab6b9583acf899",
      "8a47a83af58c3fe708ae2a6e67b946306ba59fcb81ccc5c8291bf6c89ea1214d"]),
]


@pytest.mark.parametrize("tokens, page_size, sha, b3", VECTORS)
def test_hash_vectors(tokens, page_size, sha, b3):
    assert reference_chain(hashlib.sha256, tokens, page_size) == sha
    assert reference_chain(blake3, tokens, page_size) == b3
    assert sglang_page_hashes(tokens, page_size) == sha
    assert blake3_page_hashes(tokens, page_size) == b3


def test_first_page_hash_is_plain_sha256_of_the_token_bytes():
    assert sglang_page_hashes([1, 2], 2) == [hashlib.sha256(bytes([1, 0, 0, 0, 2, 0, 0, 0])).hexdigest()]
    assert sglang_page_hashes([1, 2], 2, prior_hash="") == sglang_page_hashes([1, 2], 2)


@pytest.mark.parametrize("chain", [sglang_page_hashes, blake3_page_hashes])
def test_partial_and_empty(chain):
    assert chain([], 4) == []
    assert chain([1, 2, 3], 4) == []
    assert chain([1, 2, 3, 4, 5], 4) == chain([1, 2, 3, 4], 4)


@pytest.mark.parametrize("chain", [sglang_page_hashes, blake3_page_hashes])
@pytest.mark.parametrize("tokens, page_size", [([-1], 1), ([2**32], 1), ([1.0], 1), ([1], 0), ([1], -2), ([1], True)])
def test_hash_input_errors(chain, tokens, page_size):
    with pytest.raises(ValueError):
        chain(tokens, page_size)


token_lists = st.lists(st.integers(0, 2**32 - 1), max_size=40)


@settings(max_examples=150, deadline=None)
@given(token_lists, st.integers(1, 9))
def test_chains_match_the_reference(tokens, page_size):
    assert sglang_page_hashes(tokens, page_size) == reference_chain(hashlib.sha256, tokens, page_size)
    assert blake3_page_hashes(tokens, page_size) == reference_chain(blake3, tokens, page_size)


@settings(max_examples=150, deadline=None)
@given(token_lists, st.integers(1, 6), st.data())
@pytest.mark.parametrize("chain", [sglang_page_hashes, blake3_page_hashes])
def test_chain_prefix_and_continuation(chain, tokens, page_size, data):
    """A page's hash depends on its tokens and every page before it, nothing after; a chain can
    be continued from its last hash."""
    full = chain(tokens, page_size)
    split = data.draw(st.integers(0, len(full))) * page_size
    head = chain(tokens[:split], page_size)
    assert full[:len(head)] == head
    assert head + chain(tokens[split:], page_size, prior_hash=head[-1] if head else None) == full
    if full:
        at = data.draw(st.integers(0, len(full) * page_size - 1))
        changed = list(tokens)
        changed[at] = (changed[at] + 1) % 2**32
        other = chain(changed, page_size)
        page = at // page_size
        assert other[:page] == full[:page]
        assert all(a != b for a, b in zip(other[page:], full[page:]))


# ---- keys ----------------------------------------------------------------------------------
def test_model_tag_as_sglang_builds_it():
    assert model_tag() is None
    assert model_tag("Qwen/Qwen3-8B") == "Qwen-Qwen3-8B"
    assert model_tag("org/team/model", backend_tag="fp8") == "fp8_org-team-model"
    assert model_tag(backend_tag="v2") == "v2"


def test_page_key_forms_and_routing():
    h = sglang_page_hashes([1, 2, 3, 4], 4)[0]
    assert page_key(h) == h
    assert page_key(h, suffix="_0_k") == f"{h}_0_k"
    assert page_key(h, "Qwen-Qwen3-8B", "_0_v") == f"Qwen-Qwen3-8B_{h}_0_v"
    # every key of a page routes by its page hash (all parts of a page on one shard), tagged or not
    # (the default key profile, "sglang"); the former default matched untagged keys only
    assert routing_part(page_key(h, suffix="_0_k").encode()) == h.encode()
    assert routing_part(page_key(h, suffix="__k").encode()) == h.encode()
    assert routing_part(page_key(h, "m", "_0_k").encode()) == h.encode()
    assert routing_part(page_key(h, "fp8_Qwen-Qwen3-8B", "__k").encode()) == h.encode()
    hash_first = re.compile(KEY_PROFILES["hash-first"].encode())
    assert routing_part(page_key(h, "m", "_0_k").encode(), hash_first) == f"m_{h}_0_k".encode()


# ---- page selection ------------------------------------------------------------------------
@pytest.mark.parametrize("end, selected", [(0, 0), (3, 0), (4, 1), (7, 1), (8, 2), (9, 2), (12, 3), (100, 3)])
def test_only_whole_pages_inside_a_mark(end, selected):
    assert page_ttls(3, 4, [CacheMark(end, FIVE_MIN)]) == [FIVE_MIN] * selected + [0] * (3 - selected)


def test_overlapping_marks_take_the_longest_ttl():
    marks = [CacheMark(4, ONE_HOUR), CacheMark(12, FIVE_MIN)]
    assert page_ttls(4, 4, marks) == [ONE_HOUR, FIVE_MIN, FIVE_MIN, 0]
    marks = [CacheMark(4, FIVE_MIN), CacheMark(8, ONE_HOUR)]
    assert page_ttls(3, 4, marks) == [ONE_HOUR, ONE_HOUR, 0]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 12), st.integers(1, 8),
       st.lists(st.builds(CacheMark, st.integers(0, 120), st.sampled_from([FIVE_MIN, ONE_HOUR])), max_size=4))
def test_page_selected_iff_it_ends_at_or_before_a_mark(num_pages, page_size, marks):
    ttls = page_ttls(num_pages, page_size, marks)
    assert len(ttls) == num_pages
    for i, ttl in enumerate(ttls):
        covering = [m.ttl_ms for m in marks if (i + 1) * page_size <= m.end]
        assert ttl == max(covering, default=0)


def test_prompt_pages_keys_and_ttls():
    tokens = list(range(10))
    pages = prompt_pages(tokens, [CacheMark(5, ONE_HOUR)], 2, model="a/b", suffixes=("_0_k", "_0_v"))
    hashes = sglang_page_hashes(tokens, 2)
    assert pages.per_page == 2 and pages.pages == 5
    assert pages.keys == [f"a-b_{h}{s}" for h in hashes for s in ("_0_k", "_0_v")]
    assert pages.ttl_ms == [ONE_HOUR] * 4 + [0] * 6
    b3 = prompt_pages(tokens, [], 4, scheme="blake3")
    assert b3.keys == blake3_page_hashes(tokens, 4) and b3.ttl_ms == [0, 0]
    with pytest.raises(ValueError, match="scheme"):
        prompt_pages(tokens, [], 2, scheme="md5")
    with pytest.raises(ValueError, match="suffixes"):
        prompt_pages(tokens, [], 2, suffixes=())


def test_marks_to_pages_end_to_end():
    """A 1h system prompt and a 5m document, 8-byte pages: pages wholly inside each prefix."""
    system = [{"type": "text", "text": "S" * 20, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    messages = [{"role": "user", "content": [{"type": "text", "text": "D" * 21, "cache_control": EPHEMERAL},
                                             {"type": "text", "text": "question?"}]}]
    prompt = prompt_marks(messages, byte_tokens, system=system)
    pages = prompt_pages(prompt.token_ids, prompt.marks, 8)
    assert [m.end for m in prompt.marks] == [20, 41] and len(prompt.token_ids) == 50
    assert pages.ttl_ms == [ONE_HOUR, ONE_HOUR, FIVE_MIN, FIVE_MIN, FIVE_MIN, 0]


# ---- the read helper's grouping and hit count ----------------------------------------------
class RecordingMaster:
    """Answers batch_get_replica_list from a set of present keys and records each call."""

    def __init__(self, present):
        self.present = set(present)
        self.calls = []

    def batch_get_replica_list(self, keys, tenant_id="default", guaranteed_ttl_ms=0):
        self.calls.append((list(keys), tenant_id, guaranteed_ttl_ms))
        return [f"replicas of {k}" if k in self.present else ErrorCode.OBJECT_NOT_FOUND for k in keys]


def test_read_pages_groups_by_ttl_and_counts_leading_whole_pages():
    pages = PromptPages(keys=["a_k", "a_v", "b_k", "b_v", "c_k", "c_v"],
                        ttl_ms=[ONE_HOUR, ONE_HOUR, FIVE_MIN, FIVE_MIN, 0, 0], per_page=2)
    m = RecordingMaster({"a_k", "a_v", "b_k", "c_k", "c_v"})
    read = read_pages(m, pages, tenant_id="t1")
    assert sorted(m.calls) == sorted([(["a_k", "a_v"], "t1", ONE_HOUR), (["b_k", "b_v"], "t1", FIVE_MIN),
                                      (["c_k", "c_v"], "t1", 0)])
    assert read.hit_pages == 1  # page b lacks its V part: the usable prefix stops there
    assert read.results[3] == ErrorCode.OBJECT_NOT_FOUND and read.results[4] == "replicas of c_k"
    assert read_pages(RecordingMaster(pages.keys), pages).hit_pages == 3
    assert read_pages(RecordingMaster([]), pages).hit_pages == 0
    assert read_pages(RecordingMaster([]), PromptPages([], [])).hit_pages == 0
