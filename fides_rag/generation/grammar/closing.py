"""The shortest legal completion of a grammar from a matcher's state, in tokens: what the decoder forces when the
tokens left reach its length, so a structured answer cut by `max_new_tokens` still parses.

The search runs on llguidance's own matcher, for any grammar (JSON schema, regex, Lark), and leaves the matcher
where it found it (every token it tries is rolled back):

1. a breadth-first search over BYTES (single-byte tokens) from the state to an accepting one. Bytes the grammar
   forces (`compute_ff_bytes`) are one edge; otherwise the edges are the first bytes of the tokens the mask admits.
   States are told apart by their token masks and forced bytes along a short fixed probe from them, so a byte
   that leaves the state as it was (a letter inside a string, a digit inside a number) is a loop and is not
   expanded again. Of a large class of admitted bytes (letters, digits) one representative is tried.
2. where that finds none, a count the probe cannot see keeps states alike (a `minLength` of 60, `minItems` of 30,
   13 digits for a `minimum` of 10**12: the first and the tenth character look the same), or the one byte that
   moves on is not among the representatives (the `x` of a pattern `x`). Then a walk by the probe's rule, closing
   bytes first, looping where nothing else moves (`_walk`); where it finds none, a second search, shortest first,
   pumps each cycle it meets (a byte or a stretch that leads back to a state alike) round by round until the state
   changes, and tries the admitted bytes the representatives stood for after them (`_pumping_search`).
3. the byte completion found is then written in as few tokens as the matcher accepts (longest token first, each
   checked by the matcher), so `"}` is one token where the vocabulary has it.

The result is a real completion (the matcher accepted every token and ends accepting), of at most as many tokens
as bytes: the shortest in bytes among the states the first search told apart (the walk's and the second search's,
a short one), so its length bounds the shortest in tokens from above, which is what the budget needs: forcing it
always fits.
"""

from __future__ import annotations

import heapq
from itertools import count
from typing import Any

import numpy as np

MAX_EXPANSIONS = 4000
"""Matcher states each search may evaluate before giving up (a grammar whose completion is far away)."""
TRAIL = 64
"""Steps back along its own path the second search looks for a state alike, to find the cycle it pumps."""
PROBE = 6
"""Steps of the probe that tells states apart (see `_signature`)."""
PROBE_TRIES = 4
"""Admitted bytes a probe step tries before it takes a loop."""
_LETTERS = frozenset(range(ord("a"), ord("z") + 1)) | frozenset(range(ord("A"), ord("Z") + 1))
_DIGITS = frozenset(range(ord("0"), ord("9") + 1))
_HIGH = frozenset(range(0x80, 0x100))
_CLOSERS = b"\"')]}>,;:"
"""Bytes that end a string or a group in most grammars, in this order: tried first by the probe, which looks for
the structure around a state (others come after them: find gives -1, i.e. the last rank)."""


class TokenBytes:
    """One tokenizer's tokens as bytes: a single-byte token for each byte, and a token for each byte string."""

    def __init__(self, lltokenizer: Any, vocab_size: int):
        self.by_bytes: dict[bytes, int] = {}
        for token in range(min(vocab_size, lltokenizer.vocab_size)):
            if lltokenizer.is_special_token(token):
                continue
            text = lltokenizer.decode_bytes([token])
            if text and text not in self.by_bytes:
                self.by_bytes[text] = token
        self.byte_token = [self.by_bytes.get(bytes([b])) for b in range(256)]
        self.longest = max((len(b) for b in self.by_bytes), default=1)
        first = np.full(vocab_size, 256, dtype=np.int16)  # 256: no byte (special or empty tokens)
        for text, token in self.by_bytes.items():
            first[token] = text[0]
        self.first_byte = first
        self.candidates: dict[bytes, tuple[list[int], list[int]]] = {}
        """mask -> its candidate bytes (masks recur: every state inside a string has the same one)."""


def _candidate_bytes(mask: bytes, table: TokenBytes) -> list[int]:
    """The first bytes of the tokens the mask admits, with one representative for each large class (letters,
    digits, non-ASCII): closing punctuation first, then the rarest (the byte fewest admitted tokens start with)."""
    return _bytes_of(mask, table)[0]


def _other_bytes(mask: bytes, table: TokenBytes) -> list[int]:
    """The admitted first bytes that `_candidate_bytes` leaves out (those its representatives stand for)."""
    return _bytes_of(mask, table)[1]


def _bytes_of(mask: bytes, table: TokenBytes) -> tuple[list[int], list[int]]:
    found = table.candidates.get(mask)
    if found is None:
        if len(table.candidates) > 4096:
            table.candidates.clear()
        found = table.candidates[mask] = _first_bytes(mask, table)
    return found


def _first_bytes(mask: bytes, table: TokenBytes) -> tuple[list[int], list[int]]:
    bits = np.unpackbits(np.frombuffer(mask, dtype=np.uint8), bitorder="little")[: len(table.first_byte)]
    counts = np.bincount(table.first_byte[bits.astype(bool)], minlength=257)[:256]
    admitted = [b for b in np.flatnonzero(counts).tolist() if table.byte_token[b] is not None]
    chosen, seen = [], set()
    for b in admitted:
        group = next((g for g in (_LETTERS, _DIGITS, _HIGH) if b in g), None)
        if group is not None and sum(1 for a in admitted if a in group) > 8:
            if group is _HIGH:
                if any(a < 0x80 for a in admitted):
                    continue  # never needed to finish while some ASCII byte is admitted
                chosen.append(b)  # inside a multi-byte character: which continuation bytes fit depends on it
                continue
            if id(group) in seen:
                continue
            seen.add(id(group))
        chosen.append(b)
    rank = sorted(chosen, key=lambda b: (_CLOSERS.find(bytes([b])) % (len(_CLOSERS) + 1), counts[b], b))
    return rank, [b for b in admitted if b not in set(chosen)]


def _signature(matcher: Any, table: TokenBytes) -> tuple:
    """What tells a state apart: its mask and forced bytes, and those of the states a fixed probe reaches from it
    for PROBE steps, since two states can admit the same tokens now and differ later (an array's first item and
    its second, a string key and a string value). The probe takes the forced bytes, else the first admitted byte
    (closers and the rarest first) that changes the mask: it leaves loops (a letter in a string) and follows the
    structure."""
    key: list[Any] = []
    taken = 0
    for _ in range(PROBE):
        mask, forced = matcher.compute_bitmask(), matcher.compute_ff_bytes()
        key += [mask, forced]
        if matcher.is_accepting():
            break
        moved = _advance(matcher, table, forced) if forced else 0
        loop = None  # the first admitted byte, taken when none changes the mask
        for b in [] if forced else _candidate_bytes(mask, table)[:PROBE_TRIES]:
            moved = _advance(matcher, table, bytes([b]))
            if moved and matcher.compute_bitmask() != mask:
                break
            loop = b if moved and loop is None else loop
            matcher.rollback(moved)
            moved = 0
        if not moved and loop is not None:
            moved = _advance(matcher, table, bytes([loop]))
        if not moved:
            break
        taken += moved
    matcher.rollback(taken)
    return tuple(key)


def _advance(matcher: Any, table: TokenBytes, step: bytes) -> int:
    """Consume `step` as single-byte tokens; returns how many were consumed (0, rolled back, if it was refused)."""
    edge = [table.byte_token[b] for b in step]
    if None in edge:
        return 0
    consumed = matcher.try_consume_tokens(edge)
    if consumed != len(edge):
        matcher.rollback(consumed)
        return 0
    return consumed


def _replay(matcher: Any, tokens: list[int]) -> bool:
    return matcher.try_consume_tokens(tokens) == len(tokens)


def shortest_byte_completion(matcher: Any, table: TokenBytes, max_bytes: int) -> bytes | None:
    """The shortest byte string (of at most `max_bytes`) that takes `matcher` to an accepting state, or None.
    A first search expands each distinct state once; where that finds nothing (a count the mask cannot show, as a
    `minLength` or `minItems`: the first and tenth item look alike; or a byte the representatives do not stand
    for), a walk that takes closing bytes first, then a second search that pumps the cycles it meets."""
    if matcher.is_accepting():
        return b""
    for search in (_search, _walk, _pumping_search):
        found = search(matcher, table, max_bytes)
        if found is not None:
            return found
    return None


def _search(matcher: Any, table: TokenBytes, max_bytes: int) -> bytes | None:
    """The first search: breadth-first over bytes, each state the signature tells apart expanded once."""
    frontier: list[bytes] = [b""]
    seen = {_signature(matcher, table)}
    expansions = 0
    for _ in range(max_bytes):
        following: list[bytes] = []
        for path in frontier:
            tokens: list[int] = [table.byte_token[b] for b in path]  # type: ignore[misc]  # admitted bytes: a token each
            if not _replay(matcher, tokens):
                matcher.rollback(len(tokens))
                continue
            forced = matcher.compute_ff_bytes()
            steps = [forced] if forced else [bytes([b]) for b in _candidate_bytes(matcher.compute_bitmask(), table)]
            for step in steps:
                expansions += 1
                edge = [table.byte_token[b] for b in step]
                if None in edge:
                    continue
                consumed = matcher.try_consume_tokens(edge)
                if consumed != len(edge):
                    matcher.rollback(consumed)
                    continue
                accepting = matcher.is_accepting()
                key = None if accepting else _signature(matcher, table)
                matcher.rollback(len(edge))
                if accepting:
                    matcher.rollback(len(tokens))
                    return path + step
                if key not in seen:
                    seen.add(key)  # type: ignore[arg-type]  # None only when accepting (returned above)
                    following.append(path + step)
            matcher.rollback(len(tokens))
            if expansions > MAX_EXPANSIONS:
                return None
        if not following:
            return None
        frontier = following
    return None


def _walk(matcher: Any, table: TokenBytes, max_bytes: int) -> bytes | None:
    """A completion by the probe's rule, followed to the end: the forced bytes, else the first of PROBE_TRIES
    representatives (closing punctuation first) that changes the mask, else the first admitted one (a loop, as a
    character of a string whose minLength is not reached yet). Cheap (a few masks a byte) and short where a count is
    all that hides the way out; None where it does not reach an accepting state within `max_bytes`."""
    path, taken = bytearray(), 0
    try:
        while len(path) <= max_bytes:
            if matcher.is_accepting():
                return bytes(path)
            forced = matcher.compute_ff_bytes()
            if forced:
                moved = _advance(matcher, table, forced)
                if not moved:
                    return None
                path += forced
                taken += moved
                continue
            mask, loop, moved = matcher.compute_bitmask(), None, 0
            for b in _plain(_candidate_bytes(mask, table))[:PROBE_TRIES]:
                moved = _advance(matcher, table, bytes([b]))
                if moved and (matcher.is_accepting() or matcher.compute_bitmask() != mask):
                    path.append(b)
                    break
                loop = b if moved and loop is None else loop
                matcher.rollback(moved)
                moved = 0
            if not moved:
                if loop is None:
                    return None
                moved = _advance(matcher, table, bytes([loop]))
                path.append(loop)
            taken += moved
        return None
    finally:
        matcher.rollback(taken)


class _Node:
    """A state of the second search: the bytes that reach it, its signature, the node it came from and its level
    (the cycles left on the way, see `_pumping_search`). A node that pumps a cycle holds the cycle's bytes
    (`segment`), taken once more each time it is expanded; a node with `rest` tries the admitted bytes its state's
    representatives stood for."""

    __slots__ = ("path", "key", "parent", "level", "segment", "rest")

    def __init__(
        self,
        path: bytes,
        key: tuple,
        parent: _Node | None,
        level: int,
        segment: bytes | None = None,
        rest: bool = False,
    ) -> None:
        self.path, self.key, self.parent, self.level, self.segment, self.rest = path, key, parent, level, segment, rest

    def cycle_start(self, key: tuple) -> _Node | None:
        """The node on this one's own path, at its level and within TRAIL steps back, whose state is alike to `key`."""
        node: _Node | None = self
        for _ in range(TRAIL):
            if node is None or node.level != self.level:
                return None
            if node.key == key and node.segment is None and not node.rest:
                return node
            node = node.parent
        return None


def _plain(candidates: list[int]) -> list[int]:
    """The bytes of `candidates` that start no escape sequence and no multi-byte character (a closing never needs
    one where a plain byte is admitted), or all of them where none is plain."""
    plain = [b for b in candidates if b < 0x80 and b != 0x5C]
    return plain or candidates


def _pumping_search(matcher: Any, table: TokenBytes, max_bytes: int) -> bytes | None:
    """A completion where states the signature cannot tell apart hide the way out (see `shortest_byte_completion`),
    shortest path first. A step back to a state alike to one on its own path is a cycle (a character of a string,
    an item of an array), pumped round by round until the state changes; the state it changes to starts a new
    level, in which the states alike to those before it are new again (the second string of an array whose strings
    have a minLength looks like the first). The bytes a representative stood for are tried after the
    representatives, at the same length. Bounded by MAX_EXPANSIONS and `max_bytes`; None where it finds nothing."""
    start = _Node(b"", _signature(matcher, table), None, 0)
    seen, pumped, order = {(start.key, 0)}, set(), count()
    queue: list[tuple[int, int, _Node]] = [(0, next(order), start)]
    expansions = 0

    def push(length: int, node: _Node) -> None:
        heapq.heappush(queue, (length, next(order), node))

    def step_to(step: bytes) -> tuple[bool, tuple | None]:
        """(accepting, signature) after `step` from the matcher's state (rolled back); (False, None) if refused."""
        moved = _advance(matcher, table, step)
        if not moved:
            return False, None
        accepting = matcher.is_accepting()
        key = None if accepting else _signature(matcher, table)
        matcher.rollback(moved)
        return accepting, key

    while queue and expansions <= MAX_EXPANSIONS:
        _, _, node = heapq.heappop(queue)
        tokens: list[int] = [table.byte_token[b] for b in node.path]  # type: ignore[misc]  # admitted bytes: a token each
        if not _replay(matcher, tokens):
            matcher.rollback(len(tokens))
            continue
        try:
            if node.segment is not None:  # one more round of its cycle
                expansions += 1
                accepting, key = step_to(node.segment)
                path = node.path + node.segment
                if accepting:
                    return path
                if key == node.key and len(path) + len(node.segment) <= max_bytes:
                    push(len(path) + len(node.segment), _Node(path, key, node.parent, node.level, node.segment))
                elif key is not None and key != node.key and (key, node.level + 1) not in seen:
                    seen.add((key, node.level + 1))
                    push(len(path), _Node(path, key, node, node.level + 1))
                continue
            forced = matcher.compute_ff_bytes()
            if forced:
                steps = [forced]
            else:
                mask = matcher.compute_bitmask()
                steps = [bytes([b]) for b in _plain((_other_bytes if node.rest else _candidate_bytes)(mask, table))]
                if not node.rest and _plain(_other_bytes(mask, table)):
                    push(len(node.path) + 1, _Node(node.path, node.key, node.parent, node.level, rest=True))
            for step in steps:
                expansions += 1
                accepting, key = step_to(step)
                path = node.path + step
                if accepting:
                    return path
                if key is None or len(path) > max_bytes:
                    continue
                if (key, node.level) not in seen:
                    seen.add((key, node.level))
                    push(len(path), _Node(path, key, node, node.level))
                    continue
                began = node.cycle_start(key)
                segment = b"" if began is None else path[len(began.path) :]
                if (
                    began is not None and (began, len(segment)) not in pumped
                ):  # one pump per cycle: its start and length
                    pumped.add((began, len(segment)))
                    push(len(path) + len(segment), _Node(path, key, node, node.level, segment))
        finally:
            matcher.rollback(len(tokens))
    return None


def as_tokens(matcher: Any, table: TokenBytes, text: bytes) -> list[int] | None:
    """`text` in as few tokens as the matcher accepts from its state (longest token first), or None."""
    tokens: list[int] = []
    at = 0
    while at < len(text):
        for end in range(min(len(text), at + table.longest), at, -1):
            token = table.by_bytes.get(text[at:end])
            if token is not None and matcher.try_consume_tokens([token]) == 1:
                tokens.append(token)
                at = end
                break
        else:
            matcher.rollback(len(tokens))
            return None
    accepting = matcher.is_accepting()
    matcher.rollback(len(tokens))
    return tokens if accepting else None


def shortest_completion(matcher: Any, table: TokenBytes, max_tokens: int) -> list[int] | None:
    """A completion of `matcher`'s grammar from its state in tokens (see the module's docstring), or None when
    the search finds none within its bounds. The matcher is left as it was."""
    text = shortest_byte_completion(matcher, table, max_bytes=max(4 * max_tokens, 16))
    if text is None:
        return None
    tokens = as_tokens(matcher, table, text)
    if tokens is None:  # the byte path itself is always accepted
        tokens = [table.byte_token[b] for b in text]  # type: ignore[misc]  # admitted bytes: a token each
    return tokens


def completes(matcher: Any, tokens: list[int]) -> bool:
    """Whether `tokens` take `matcher` from its state to an accepting one (the matcher is left as it was)."""
    consumed = matcher.try_consume_tokens(tokens)
    accepting = consumed == len(tokens) and matcher.is_accepting()
    matcher.rollback(consumed)
    return accepting
