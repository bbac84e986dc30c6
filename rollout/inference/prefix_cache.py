"""A radix tree of token ids whose nodes hold the KV cache of their tokens (RadixAttention-style).

GRPO sends each prompt N times and multi-turn agents resend their whole history: a request whose
prompt starts with a cached prefix only prefills the rest. Each node's edge is a run of token
ids with, for every layer, keys and values [H, n, D] for those tokens (legend: H = KV heads,
n = tokens on the edge, D = head dim). Least recently used leaves are evicted beyond `max_tokens`.
The tree belongs to the engine thread; it is not thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["LayerKV", "PrefixCache"]

LayerKV = tuple[torch.Tensor, torch.Tensor]
"""Keys and values of one layer, [H, n, D] each."""


@dataclass(eq=False, slots=True)
class _Node:
    tokens: tuple[int, ...]
    kv: list[LayerKV]
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)
    last_used: int = 0


def _slice(kv: list[LayerKV], start: int, stop: int | None = None, copy: bool = False) -> list[LayerKV]:
    out = [(k[:, start:stop], v[:, start:stop]) for k, v in kv]
    return [(k.clone(), v.clone()) for k, v in out] if copy else out


class PrefixCache:
    """Longest-prefix lookup and insertion of KV tensors keyed by token ids."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._root = _Node(tokens=(), kv=[], parent=None)
        self._clock = 0
        self.num_tokens = 0
        """Tokens held (the sum of edge lengths)."""

    def flush(self) -> None:
        """Forget everything (after a weight update every cached KV is stale)."""
        self._root = _Node(tokens=(), kv=[], parent=None)
        self.num_tokens = 0

    def match(self, ids: Sequence[int], limit: int) -> tuple[int, list[LayerKV] | None]:
        """(m, per-layer KV [H, m, D]) of the longest cached prefix of `ids`, m <= limit."""
        self._clock += 1
        pieces: list[list[LayerKV]] = []
        node, pos = self._root, 0
        while pos < limit:
            child = node.children.get(ids[pos])
            if child is None:
                break
            common = _common_length(child.tokens, ids, pos, limit)
            child.last_used = self._clock
            pieces.append(_slice(child.kv, 0, common) if common < len(child.tokens) else child.kv)
            pos += common
            if common < len(child.tokens):
                break
            node = child
        if pos == 0:
            return 0, None
        layers = [
            (torch.cat([p[i][0] for p in pieces], dim=1), torch.cat([p[i][1] for p in pieces], dim=1))
            for i in range(len(pieces[0]))
        ]
        return pos, layers

    def insert(self, ids: Sequence[int], kv: list[LayerKV], start: int) -> None:
        """Cache `ids`, given the KV of `ids[start:]` ([H, len(ids) - start, D] per layer).

        Tokens already cached are skipped; if the tree no longer holds `ids[:start]` (evicted),
        nothing is inserted, since the missing KV is not at hand.
        """
        if self.max_tokens <= 0 or len(ids) <= start:
            return
        self._clock += 1
        node, pos = self._root, 0
        while pos < len(ids):
            child = node.children.get(ids[pos])
            if child is None:
                if pos < start:
                    return
                leaf = _Node(tokens=tuple(ids[pos:]), kv=_slice(kv, pos - start, copy=True), parent=node)
                leaf.last_used = self._clock
                node.children[ids[pos]] = leaf
                self.num_tokens += len(leaf.tokens)
                break
            common = _common_length(child.tokens, ids, pos, len(ids))
            if common < len(child.tokens):
                child = self._split(child, common)
            child.last_used = self._clock
            node, pos = child, pos + common
        self._evict()

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut `node`'s edge after `at` tokens; returns the new upper node."""
        assert node.parent is not None
        upper = _Node(tokens=node.tokens[:at], kv=_slice(node.kv, 0, at, copy=True), parent=node.parent)
        upper.last_used = node.last_used
        node.parent.children[node.tokens[0]] = upper
        node.tokens, node.kv, node.parent = node.tokens[at:], _slice(node.kv, at, copy=True), upper
        upper.children[node.tokens[0]] = node
        return upper

    def _evict(self) -> None:
        while self.num_tokens > self.max_tokens:
            leaf = min(self._leaves(), key=lambda n: n.last_used, default=None)
            if leaf is None or leaf.parent is None:
                return
            del leaf.parent.children[leaf.tokens[0]]
            self.num_tokens -= len(leaf.tokens)

    def _leaves(self) -> list[_Node]:
        leaves, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                leaves.append(node)
        return leaves


def _common_length(edge: tuple[int, ...], ids: Sequence[int], pos: int, limit: int) -> int:
    n = min(len(edge), limit - pos)
    for i in range(n):
        if edge[i] != ids[pos + i]:
            return i
    return n
