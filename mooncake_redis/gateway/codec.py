"""struct_pack (yalantinglibs), the serialisation of every Mooncake coro_rpc body.

Type descriptors (`i32`, `string`, `vector(t)`, `struct_(cls, ...)`, `args(...)`, ...) compute their
literal, hash and body heads once, when built. Each type's reader and writer is one Python function
generated once per container-length width (as collections.namedtuple does): nested structs,
strings, optionals and variants are inlined, runs of fixed fields are one struct call, so a body
costs a few calls rather than one per field. `Type.source()` shows the generated code.

Wire rules (yalantinglibs struct_pack: packer.hpp, unpacker.hpp, calculate_size.hpp,
type_calculate.hpp):
- head: u32 LE hash = MD5(literal)[0:4] read big-endian, low bit cleared. Low bit 1: a metainfo
  byte follows; bits 3-4 the width of every container length (1, 2, 4, 8 bytes), bit 2 the
  NUL-terminated type literal follows, bits 0-1 compatible fields (unused by Mooncake, refused).
- the width is the smallest that holds the largest string or container length in the message.
- body: ints and enums fixed-width LE; bool one byte; string and vector length + data; optional
  flag + value; variant u8 index + value; expected flag + value or error; std::pair<u64,u64> (the
  UUID, trivially serialisable) raw 16 bytes; other structs and argument tuples field by field.

Python values: ints; bool; strings decode to bytes (encode takes bytes or str); vector -> list;
map -> dict; optional -> None or the value; variant -> (index, value); expected -> the value (None
for void) or an `Err`; UUID -> (hi, lo); structs -> their NamedTuple; requests -> a tuple.
"""
from __future__ import annotations

import hashlib
import struct
from typing import Any, Callable


class CodecError(ValueError):
    """A body that is not a valid encoding of the type (or a value that does not fit it)."""


class Err:
    """The error side of a tl::expected: Mooncake's ErrorCode, an int."""

    __slots__ = ("code",)

    def __init__(self, code: int):
        self.code = code

    def __eq__(self, other):
        return type(other) is Err and other.code == self.code

    def __hash__(self):
        return hash((Err, self.code))

    def __repr__(self):
        return f"Err({self.code})"


class _Wide(Exception):
    """A length does not fit the width being tried: encode starts again one width wider."""


_WIDTHS = (1, 2, 4, 8)  # by width code, metainfo bits 3-4
_LIMITS = (0xFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)
_LEN_FMT = ("B", "H", "I", "Q")
_BYTE = tuple(bytes((i,)) for i in range(256))  # one-byte lengths, flags and indexes
_U32 = struct.Struct("<I")


class Type:
    """A struct_pack type: kind and parts (what it is made of), literal, hash, the heads of a body
    per width code and literal flag, and the generated reader and writer per width code."""

    def __init__(self, name: str, literal: bytes, kind: str, parts: tuple = (),
                 fixed: str | None = None, cls: type | None = None):
        self.name, self.literal, self.kind, self.parts = name, literal, kind, parts
        self.fixed, self.cls = fixed, cls  # struct format of a fixed scalar; a struct's NamedTuple
        self.hash = int.from_bytes(hashlib.md5(literal).digest()[:4], "big") & 0xFFFFFFFE
        self.literal0 = literal + b"\0"
        marked = _U32.pack(self.hash | 1)
        self.heads = (tuple(_U32.pack(self.hash) if c == 0 else marked + _BYTE[c << 3] for c in range(4)),
                      tuple(marked + _BYTE[c << 3 | 4] + self.literal0 for c in range(4)))
        self._readers: list = [None] * 4
        self._writers: list = [None] * 4

    def __repr__(self):
        return self.name

    def least(self, code: int) -> int:
        """The fewest body bytes one value takes at this width (bounds a container's count)."""
        if self.kind in ("struct", "args"):
            return sum(t.least(code) for t in self.parts)
        if self.kind in ("string", "vector", "map"):
            return _WIDTHS[code]
        return struct.calcsize("<" + self.fixed) if self.fixed else {"uuid": 16, "void": 0}.get(self.kind, 1)

    def source(self, code: int = 0, side: str = "read") -> str:
        return _emit(self, code, side)[0]

    def reader(self, code: int) -> Callable[[bytes, int], tuple[Any, int]]:
        """(buf, pos) -> (value, pos after it)."""
        r = self._readers[code]
        if r is None:
            r = self._readers[code] = _build(*_emit(self, code, "read"))
        return r

    def writer(self, code: int) -> Callable[[Any, list], None]:
        """(value, parts): appends the value's bytes to parts; raises _Wide past the width."""
        w = self._writers[code]
        if w is None:
            w = self._writers[code] = _build(*_emit(self, code, "write"))
        return w


def _scalar(tid: int, fmt: str, name: str) -> Type:
    return Type(name, bytes((tid,)), "scalar", fixed=fmt)


i32, u32, i64, u64 = _scalar(1, "i", "i32"), _scalar(2, "I", "u32"), _scalar(3, "q", "i64"), _scalar(4, "Q", "u64")
i8, u8, i16, u16 = _scalar(5, "b", "i8"), _scalar(6, "B", "u8"), _scalar(7, "h", "i16"), _scalar(8, "H", "u16")
f64 = _scalar(18, "d", "f64")
boolean = Type("bool", b"\x0b", "bool", fixed="?")
string = Type("string", b"\x80\x0c", "string")
void = Type("void", b"\xfa", "void")  # expected<void>'s value: nothing on the wire, None here
# std::pair<uint64_t, uint64_t>, trivially serialisable: raw 16 bytes; its literal ends with the
# pack alignment and the alignment as size literals (n + 129): 0x89 0x89 for 8, 8.
uuid = Type("UUID", b"\xfd\x04\x04\x89\x89\xff", "uuid")


def vector(el: Type) -> Type:
    """std::vector<el>; of fixed scalars a trivially copyable container (one struct call)."""
    return Type(f"vector<{el.name}>", b"\x84" + el.literal, "vector", (el,))


def unordered_map(k: Type, v: Type) -> Type:
    """std::unordered_map<k, v>: count, then key and value pairs; a dict in Python."""
    return Type(f"unordered_map<{k.name},{v.name}>", b"\x82" + k.literal + v.literal, "map", (k, v))


def optional(el: Type) -> Type:
    return Type(f"optional<{el.name}>", b"\x85" + el.literal, "optional", (el,))


def variant(*alts: Type) -> Type:
    """std::variant<alts...>: u8 index + the alternative; (index, value) in Python."""
    return Type("variant<" + ",".join(a.name for a in alts) + ">",
                b"\x86" + b"".join(a.literal for a in alts) + b"\xff", "variant", alts)


def expected(val: Type, err: Type = i32) -> Type:
    """tl::expected<val, err> (Mooncake's err is ErrorCode, an int32 enum): flag 1 + value, or
    flag 0 + error. Reads as the value, or Err(error); expected<void>'s value is None."""
    return Type(f"expected<{val.name},{err.name}>", b"\x87" + val.literal + err.literal, "expected", (val, err))


def struct_(cls: Any, **fields: Type) -> Type:
    """A non-trivial struct (YLT_REFL'd or aggregate) read as the NamedTuple cls: its fields by
    keyword, in declaration order, which must be the NamedTuple's order."""
    if tuple(fields) != tuple(cls._fields):
        raise TypeError(f"{cls.__name__}: fields {tuple(fields)} are not {cls._fields}")
    types = tuple(fields.values())
    return Type(cls.__name__, b"\xfd" + b"".join(t.literal for t in types) + b"\xff", "struct", types, cls=cls)


def args(*types: Type) -> Type:
    """A request: std::tuple of its parameters. One parameter is sent bare (its own literal and
    hash) but still reads as and is written from a 1-tuple, so handlers always get a tuple. No
    parameter at all is NO_ARGS: the empty body."""
    if not types:
        return NO_ARGS
    literal = types[0].literal if len(types) == 1 else b"\xfd" + b"".join(t.literal for t in types) + b"\xff"
    return Type("args(" + ",".join(t.name for t in types) + ")", literal, "args", types)


NO_ARGS = Type("args()", b"", "args")


# ------------------------------------------------------------------ code generation

class _Src:
    """Lines of one generated function, its globals, and fresh local names."""

    def __init__(self):
        self.lines: list[str] = []
        self.env: dict[str, Any] = {"CodecError": CodecError, "Err": Err, "Wide": _Wide, "BYTE": _BYTE,
                                    "new": tuple.__new__, "as_bytes": _as_bytes, "unpack_from": struct.unpack_from,
                                    "pack": struct.pack}
        self.n = 0

    def var(self, prefix: str = "v") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def const(self, value: Any, prefix: str = "k") -> str:
        name = self.var(prefix)
        self.env[name] = value
        return name

    def add(self, ind: int, *lines: str):
        self.lines += ["    " * ind + x for x in lines]


def _build(src: str, env: dict) -> Callable:
    exec(src, env)  # noqa: S102 - generated from the type's structure only, never from data
    return env["f"]


def _as_bytes(v) -> bytes:
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise CodecError(f"a string takes bytes or str, not {type(v).__name__}")


def _fixed(t: Type) -> str:
    """The struct format of a fixed scalar (what the runs and scalars are made of)."""
    assert t.fixed is not None, t
    return t.fixed


def _runs(types: tuple[Type, ...]) -> list[list[Type]]:
    """Consecutive fixed scalars form one run (one struct call); any other field stands alone."""
    groups: list[list[Type]] = []
    for t in types:
        if t.fixed is not None and groups and groups[-1][0].fixed is not None:
            groups[-1].append(t)
        else:
            groups.append([t])
    return groups


def _emit(t: Type, code: int, side: str) -> tuple[str, dict]:
    """The source and globals of t's reader ("read") or writer ("write") at a width code."""
    s = _Src()
    if side == "read":
        s.add(0, "def f(b, p):")
        s.add(1, f"return {_read(s, t, code, 1)}, p")
    else:
        s.add(0, "def f(v, out):", "    ap = out.append")
        _write(s, t, "v", code, 1)
    return "\n".join(s.lines) + "\n", s.env


def _read_length(s: _Src, code: int, ind: int, least: int, what: str = "elements") -> str:
    """A length, refused before anything is allocated if the rest of the body cannot hold it. (A
    1-byte string length goes unchecked: its slice comes out short and leaves p past the end.)"""
    n = s.var("n")
    if code == 0:
        s.add(ind, f"{n} = b[p]", "p += 1")
    else:
        s.add(ind, f"{n} = unpack_from('<{_LEN_FMT[code]}', b, p)[0]", f"p += {_WIDTHS[code]}")
    if least:
        s.add(ind, f"if {n} * {least} > len(b) - p: "
                   f"raise CodecError(f'{{{n}}} {what} claimed at {{p}}, {{len(b) - p}} bytes left')")
    return n


def _read(s: _Src, t: Type, code: int, ind: int) -> str:
    """Appends code reading one t at b[p] (advancing p); returns the local holding the value."""
    k, v = t.kind, s.var()
    if k in ("scalar", "bool", "struct", "args"):
        types = (t,) if k in ("scalar", "bool") else t.parts
        names = []
        for run in _runs(types):
            if run[0].fixed is None:
                names.append(_read(s, run[0], code, ind))
                continue
            vs = [s.var() for _ in run]
            names += vs
            st_ = struct.Struct("<" + "".join("B" if x is boolean else _fixed(x) for x in run))
            s.add(ind, f"{', '.join(vs)}, = {s.const(st_.unpack_from, 'u')}(b, p)", f"p += {st_.size}")
            for name, x in zip(vs, run):
                if x is boolean:  # only 0 and 1, so that decode-encode is exact
                    s.add(ind, f"if {name} > 1: raise CodecError(f'bool byte {{{name}}} before {{p}}')",
                          f"{name} = {name} == 1")
        if k in ("scalar", "bool"):
            return names[0]
        tup = f"({', '.join(names)},)" if names else "()"
        s.add(ind, f"{v} = new({s.const(t.cls, 'c')}, {tup})" if t.cls else f"{v} = {tup}")
    elif k == "void":
        s.add(ind, f"{v} = None")
    elif k == "uuid":
        s.add(ind, f"{v} = {s.const(struct.Struct('<QQ').unpack_from, 'u')}(b, p)", "p += 16")
    elif k == "string":
        if code == 0:
            e = s.var("e")
            s.add(ind, f"{e} = p + 1 + b[p]", f"{v} = b[p + 1:{e}]", f"p = {e}")
        else:  # wide lengths reach 2^64: always bounded
            n = _read_length(s, code, ind, 1, "bytes")
            s.add(ind, f"{v} = b[p:p + {n}]", f"p += {n}")
    elif k in ("vector", "map"):
        el = t.parts[0]
        if k == "vector" and el.kind == "scalar":  # trivially copyable: one unpack
            size = el.least(0)
            n = _read_length(s, code, ind, size)
            s.add(ind, f"{v} = list(unpack_from(f'<{{{n}}}{el.fixed}', b, p))", f"p += {n} * {size}")
        elif k == "vector" and el is string and code == 0:  # batches of keys: no loop statements
            n = _read_length(s, code, ind, 1)
            s.add(ind, f"{v} = [b[p + 1:(p := p + 1 + b[p])] for _ in range({n})]")
        else:
            n = _read_length(s, code, ind, max(1, sum(x.least(code) for x in t.parts)))
            s.add(ind, f"{v} = {'[]' if k == 'vector' else '{}'}", f"for _ in range({n}):")
            item = _read(s, el, code, ind + 1)
            if k == "vector":
                s.add(ind + 1, f"{v}.append({item})")
            else:
                s.add(ind + 1, f"{v}[{item}] = {_read(s, t.parts[1], code, ind + 1)}")
    elif k in ("optional", "expected"):
        flag = s.var("f")
        s.add(ind, f"{flag} = b[p]", "p += 1", f"if {flag} == 1:")
        s.add(ind + 1, f"{v} = {_read(s, t.parts[0], code, ind + 1)}")
        s.add(ind, f"elif {flag} == 0:")
        s.add(ind + 1, f"{v} = None" if k == "optional" else f"{v} = Err({_read(s, t.parts[1], code, ind + 1)})")
        s.add(ind, f"else: raise CodecError(f'flag byte {{{flag}}} before {{p}}')")
    elif k == "variant":
        idx = s.var("i")
        s.add(ind, f"{idx} = b[p]", "p += 1")
        for i, alt in enumerate(t.parts):
            s.add(ind, f"{'if' if i == 0 else 'elif'} {idx} == {i}:")
            s.add(ind + 1, f"{v} = ({i}, {_read(s, alt, code, ind + 1)})")
        s.add(ind, f"else: raise CodecError(f'variant index {{{idx}}} of {len(t.parts)}')")
    else:
        raise TypeError(f"no reader for {t.kind}")
    return v


def _write_length(s: _Src, n: str, code: int, ind: int):
    s.add(ind, f"if {n} > {_LIMITS[code]}: raise Wide")
    s.add(ind, f"ap(BYTE[{n}])" if code == 0 else f"ap(pack('<{_LEN_FMT[code]}', {n}))")


def _write(s: _Src, t: Type, expr: str, code: int, ind: int):
    """Appends code writing the value `expr` (a local name) as t."""
    k = t.kind
    if k == "scalar":
        s.add(ind, f"ap({s.const(struct.Struct('<' + _fixed(t)).pack, 'p')}({expr}))")
    elif k == "bool":
        s.add(ind, f"ap(b'\\x01' if {expr} else b'\\x00')")
    elif k in ("struct", "args"):
        names = [s.var() for _ in t.parts]
        s.add(ind, f"{', '.join(names)}, = {expr}" if names else f"() = {expr}")  # a wrong count fails
        i = 0
        for run in _runs(t.parts):
            vs, i = names[i:i + len(run)], i + len(run)
            if run[0].fixed is None or len(run) == 1:
                _write(s, run[0], vs[0], code, ind)
            else:
                packer = s.const(struct.Struct("<" + "".join(_fixed(x) for x in run)).pack, "p")
                s.add(ind, f"ap({packer}({', '.join(vs)}))")
    elif k == "void":
        s.add(ind, f"if {expr} is not None: raise CodecError(f'expected<void> takes None, not {{{expr}!r}}')")
    elif k == "uuid":
        s.add(ind, f"ap({s.const(struct.Struct('<QQ').pack, 'p')}(*{expr}))")
    elif k == "string":
        x, n = s.var("s"), s.var("n")
        s.add(ind, f"{x} = {expr}", f"if type({x}) is not bytes: {x} = as_bytes({x})", f"{n} = len({x})")
        _write_length(s, n, code, ind)
        s.add(ind, f"ap({x})")
    elif k in ("vector", "map"):
        el, n = t.parts[0], s.var("n")
        items = expr
        if k == "map":
            items = s.var("m")
            s.add(ind, f"{items} = {expr}.items() if isinstance({expr}, dict) else {expr}")
        s.add(ind, f"{n} = len({items})")
        _write_length(s, n, code, ind)
        if k == "vector" and el.kind == "scalar":  # trivially copyable: one pack
            s.add(ind, f"ap(pack(f'<{{{n}}}{el.fixed}', *{items}))")
        elif k == "vector":
            x = s.var("x")
            s.add(ind, f"for {x} in {items}:")
            _write(s, el, x, code, ind + 1)
        else:
            key, x = s.var("k"), s.var("x")
            s.add(ind, f"for {key}, {x} in {items}:")
            _write(s, el, key, code, ind + 1)
            _write(s, t.parts[1], x, code, ind + 1)
    elif k == "optional":
        s.add(ind, f"if {expr} is None: ap(b'\\x00')", "else:", "    ap(b'\\x01')")
        _write(s, t.parts[0], expr, code, ind + 1)
    elif k == "expected":
        code_var = s.var("e")
        s.add(ind, f"if type({expr}) is Err:", "    ap(b'\\x00')", f"    {code_var} = {expr}.code")
        _write(s, t.parts[1], code_var, code, ind + 1)
        s.add(ind, "else:", "    ap(b'\\x01')")
        _write(s, t.parts[0], expr, code, ind + 1)
    elif k == "variant":
        idx, x = s.var("i"), s.var("x")
        s.add(ind, f"{idx}, {x} = {expr}")
        for i, alt in enumerate(t.parts):
            s.add(ind, f"{'if' if i == 0 else 'elif'} {idx} == {i}:", f"    ap(b'\\x{i:02x}')")
            _write(s, alt, x, code, ind + 1)
        s.add(ind, f"else: raise CodecError(f'variant index {{{idx}!r}} of {len(t.parts)}')")
    else:
        raise TypeError(f"no writer for {t.kind}")


# ------------------------------------------------------------------ bodies

def decode(t: Type | None, body: bytes) -> tuple[Any, bool]:
    """Decode a body as type t (None or NO_ARGS: a request without parameters, the empty body).
    Returns (value, literal_present). Takes every form struct_pack writes: with or without the
    metainfo byte, any length width, with or without the literal. Raises CodecError only."""
    if t is None or t is NO_ARGS:
        if body:
            raise CodecError(f"a request without parameters has no body, not {len(body)} bytes")
        return (), False
    if type(body) is not bytes:
        body = bytes(body)
    has_literal, head = True, t.heads[1][0]
    try:
        if body.startswith(head):  # the Debug client's form (literal, 1-byte lengths): fast path
            value, p = (t._readers[0] or t.reader(0))(body, len(head))
        else:
            h = _U32.unpack_from(body, 0)[0]
            if (h ^ t.hash) > 1:
                raise CodecError(f"hash 0x{h & 0xFFFFFFFE:08x} is not {t.name}'s 0x{t.hash:08x}")
            p, code, has_literal = 4, 0, False
            if h & 1:
                meta, p = body[4], 5
                if meta & 3:
                    raise CodecError("compatible fields are not supported")
                if meta & 4:
                    if body[5:5 + len(t.literal0)] != t.literal0:
                        raise CodecError(f"type literal differs from {t.name}'s {t.literal.hex()}")
                    p, has_literal = p + len(t.literal0), True
                code = (meta >> 3) & 3
            value, p = (t._readers[code] or t.reader(code))(body, p)
    except (IndexError, struct.error, OverflowError):  # b[p] or unpack_from past the end
        raise CodecError(f"{t.name}: the body ({len(body)} bytes) ends too soon") from None
    if p != len(body):
        if p > len(body):
            raise CodecError(f"{t.name}: a length runs past the end of the body ({len(body)} bytes)")
        raise CodecError(f"{t.name}: {len(body) - p} bytes after the value")
    return value, has_literal


def encode(t: Type | None, value: Any, literal: bool = False) -> bytes:
    """Encode value as type t with the length width struct_pack picks (the smallest that holds
    every length: width 1 first, wider only if a length overflows it), a metainfo byte only if
    needed (width > 1 or literal), and the literal if asked. A misfit value raises CodecError."""
    if t is None or t is NO_ARGS:
        if value:
            raise CodecError("a request without parameters takes ()")
        return b""
    heads = t.heads[1 if literal else 0]
    for code in range(4):
        out = [heads[code]]
        try:
            (t._writers[code] or t.writer(code))(value, out)
        except _Wide:
            continue
        except (struct.error, TypeError, ValueError, AttributeError, IndexError, OverflowError) as e:
            raise CodecError(f"cannot encode {repr(value)[:200]} as {t.name}: {e}") from None
        return b"".join(out)
    raise CodecError(f"{t.name}: a length beyond 64 bits")  # not reachable with real lengths


def prepare(t: Type | None) -> None:
    """Generate t's readers and writers for every width now (the schema does it at import)."""
    if t is not None and t is not NO_ARGS:
        for code in range(4):
            t.reader(code)
            t.writer(code)
