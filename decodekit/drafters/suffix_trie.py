"""The suffix tries behind :class:`~decodekit.drafters.SuffixDrafter`: one per live row (its prompt and output so
far) and one global cache of earlier outputs (LRU over whole outputs). Plain Python: a match is a few dictionary
lookups, cheaper than the torch ops a tensor version would launch."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator


class TrieNode:
    """A suffix-trie node: how often its string occurred, its continuations, and the newest stamp that passed."""

    __slots__ = ("children", "count", "last")

    def __init__(self) -> None:
        self.children: dict[int, TrieNode] = {}
        self.count = 0
        self.last = 0


def extend(active: list[TrieNode], token: int, stamp: int, depth: int) -> list[TrieNode]:
    """Append ``token`` to a sequence whose suffix nodes (last 0, 1, ... tokens) are ``active``; returns the new
    ones. Each suffix of length < ``depth`` gets one more occurrence followed by ``token``."""
    new = [active[0]]
    for node in active[:depth]:
        child = node.children.get(token)
        if child is None:
            child = node.children[token] = TrieNode()
        child.count += 1
        child.last = stamp
        new.append(child)
    return new[:depth]


def retract(root: TrieNode, tokens: list[int], depth: int) -> None:
    """Undo inserting ``tokens`` (every suffix, up to ``depth`` tokens): counts down, empty nodes dropped."""
    active = [root]
    for token in tokens:
        new = [root]
        for node in active[:depth]:
            child = node.children[token]
            child.count -= 1
            if child.count == 0:
                del node.children[token]
            new.append(child)
        active = new[:depth]


class GlobalCache:
    """Earlier calls' outputs in one suffix trie, at most ``capacity`` tokens, least recently used out first."""

    def __init__(self, capacity: int, depth: int) -> None:
        self.capacity, self.depth = capacity, depth
        self.clear()

    def clear(self) -> None:
        self.root, self.sequences, self.tokens, self.next_id = TrieNode(), OrderedDict[int, list[int]](), 0, 1

    def add(self, tokens: list[int]) -> None:
        tokens = tokens[-self.capacity :] if self.capacity else []
        if not tokens:
            return
        active, stamp = [self.root], self.next_id
        for token in tokens:
            active = extend(active, token, stamp, self.depth)
        self.sequences[stamp], self.next_id, self.tokens = tokens, stamp + 1, self.tokens + len(tokens)
        while self.tokens > self.capacity:
            _, old = self.sequences.popitem(last=False)
            retract(self.root, old, self.depth)
            self.tokens -= len(old)

    def touch(self, stamp: int) -> None:
        """Mark the output ``stamp`` used (it supplied a draft)."""
        if stamp in self.sequences:
            self.sequences.move_to_end(stamp)

    def suffixes(self, history: list[int], longest: int) -> Iterator[tuple[TrieNode, int, int]]:
        """``(node, length, continuations)`` of the suffixes of ``history`` that occur in the cache followed by
        something, longest first (at most ``longest`` tokens; a binary search finds the longest, since a suffix
        occurs wherever a longer one does)."""
        lo, hi, found = 1, min(longest, len(history)), 0
        while lo <= hi:
            mid = (lo + hi) // 2
            node = self._walk(history[len(history) - mid :])
            if node is not None and node.children:
                found, lo = mid, mid + 1
            else:
                hi = mid - 1
        for length in range(found, 0, -1):
            node = self._walk(history[len(history) - length :])
            assert node is not None
            yield node, length, sum(c.count for c in node.children.values())

    def _walk(self, tokens: list[int]) -> TrieNode | None:
        node: TrieNode | None = self.root
        for token in tokens:
            node = node.children.get(token)
            if node is None:
                return None
        return node


def distinct_matches(candidates: Iterable[tuple[TrieNode, int, int]]) -> Iterator[tuple[TrieNode, int, int]]:
    """Of ``(node, length, continuations)`` longest first, the longest match per number of continuations (a shorter
    match with as many continuations has the same ones)."""
    seen = 0
    for node, length, total in candidates:
        if total > seen:
            seen = total
            yield node, length, total


class RowTrie:
    """One live row: its tokens so far and their suffix trie (``active[j]``: the node of the last ``j`` tokens)."""

    def __init__(self, tokens: list[int], prompt_length: int, depth: int) -> None:
        self.tokens, self.prompt_length, self.root = [], prompt_length, TrieNode()
        self.active = [self.root]
        self.add(tokens, depth)

    def add(self, tokens: list[int], depth: int) -> None:
        for token in tokens:
            self.active = extend(self.active, token, len(self.tokens), depth)
            self.tokens.append(token)
