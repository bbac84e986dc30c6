"""`PrefixRouter`: which of N inference servers gets a `/generate` request.

The policy follows SGLang's cache-aware router. A tree over the token ids already routed (in
blocks of `block_tokens`) records which server saw which prefix. A request goes to the server
holding its longest prefix when that covers at least `cache_threshold` of it, else to the least
busy server (ties: the smallest tree, then list order). While the servers' in-flight counts
differ by more than `balance_abs_threshold` and the busiest has more than
`balance_rel_threshold` times the least busy one's, load wins over partial prefixes; a request
whose whole prompt a server already holds (another sample of the same group) still goes there.
That last rule is ours: SGLang's router lets load win over any prefix, which splits a group.

Routing inserts the request's prefix at once, so the samples of one prompt group, sent together,
all land on the server the first one went to (one prefill, the rest from its cache), and every
later turn of an episode follows its own longer prefix there. A server marked down gets nothing
and its prefixes are forgotten (a restarted server starts with an empty cache). Pure
bookkeeping: no I/O, no clock of its own (callers pass `now`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from stacx.rollout.inference.errors import InferenceError, ServerUnavailableError

__all__ = ["PrefixRouter", "RouterConfig"]


@dataclass(kw_only=True, slots=True)
class RouterConfig:
    """The router in front of several inference servers (`stacx route`; `stacx run` starts one
    when `inference.servers` > 1 and fills `host`, `port` and `upstreams`)."""

    host: str = "127.0.0.1"
    """Interface to listen on."""
    port: int = 30000
    """TCP port (the URL the rollout and the evaluations use)."""
    upstreams: list[str] = field(default_factory=list)
    """Base URLs of the inference servers."""
    cache_threshold: float = 0.5
    """Share of a request's tokens a server must already hold for the prefix to decide."""
    balance_abs_threshold: int = 2
    """In-flight difference (busiest - least busy) above which load overrides partial prefixes
    (low: prompts of an RL rollout share a template, so a new group would otherwise follow the
    template to the first server)."""
    balance_rel_threshold: float = 1.5
    """... and only when the busiest has more than this times the least busy one's load."""
    block_tokens: int = 16
    """Granularity of the prefix tree (tokens per node, like a KV cache page)."""
    max_tree_blocks: int = 200_000
    """Nodes kept in the tree; beyond it the least recently used half is dropped."""
    probe_interval_s: float = 1.0
    """How often every server's `/health` is asked (a down one comes back once it answers 200)."""
    timeout_s: float = 600.0
    """Per forwarded call (a long generation holds the call open)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold={self.cache_threshold}: use 0..1")
        if self.block_tokens < 1 or self.max_tree_blocks < 1:
            raise ValueError("block_tokens and max_tree_blocks must be >= 1")
        if self.balance_rel_threshold < 1.0 or self.balance_abs_threshold < 0:
            raise ValueError("balance_rel_threshold >= 1 and balance_abs_threshold >= 0")
        if len(set(self.upstreams)) != len(self.upstreams):
            raise ValueError(f"upstreams lists a server twice: {self.upstreams}")


@dataclass(slots=True)
class _Node:
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)
    """Server -> when it last got a request through this node."""


class PrefixRouter:
    """Server choice, in-flight counts and up/down state of N servers (see the module docstring)."""

    def __init__(self, config: RouterConfig) -> None:
        if not config.upstreams:
            raise InferenceError("router: upstreams is empty; name at least one inference server URL")
        self.config = config
        self.upstreams = [u.rstrip("/") for u in config.upstreams]
        self.in_flight = dict.fromkeys(self.upstreams, 0)
        self.up = dict.fromkeys(self.upstreams, True)
        self.routed = dict.fromkeys(self.upstreams, 0)
        """Requests sent to each server so far."""
        self.num_failovers = 0
        """Requests moved off a server that failed them."""
        self._root = _Node()
        self._blocks = dict.fromkeys(self.upstreams, 0)
        self._num_nodes = 0

    # ------------------------------------------------------------------ choice

    def choose(self, input_ids: Sequence[int] | None, now: float, exclude: Sequence[str] = ()) -> str:
        """The server for a request (None ids: by load only); ServerUnavailableError when no
        server outside `exclude` is up. The prefix is recorded as routed there."""
        candidates = [u for u in self.upstreams if self.up[u] and u not in exclude]
        if not candidates:
            raise ServerUnavailableError(
                f"router: no inference server is up (of {len(self.upstreams)}; tried {list(exclude)})"
            )
        chosen = self._pick(list(input_ids or ()), candidates)
        if input_ids:
            self._insert(list(input_ids), chosen, now)
        self.routed[chosen] += 1
        return chosen

    def _pick(self, ids: list[int], candidates: list[str]) -> str:
        least_busy = min(candidates, key=self._load_key)
        if not ids:
            return least_busy
        matched = self._matched_tokens(ids)
        best = max(candidates, key=lambda u: (matched.get(u, 0), -self.upstreams.index(u)))
        held = matched.get(best, 0)
        if held and held > len(ids) - self.config.block_tokens:
            return best  # the whole prompt is there: a sample of the same group
        if self._imbalanced(candidates):
            return least_busy
        return best if held and held >= self.config.cache_threshold * len(ids) else least_busy

    def _load_key(self, url: str) -> tuple[int, int, int]:
        return self.in_flight[url], self._blocks[url], self.upstreams.index(url)

    def _imbalanced(self, candidates: list[str]) -> bool:
        loads = [self.in_flight[u] for u in candidates]
        busiest, idlest = max(loads), min(loads)
        return (busiest - idlest > self.config.balance_abs_threshold
                and busiest > self.config.balance_rel_threshold * idlest)

    # ------------------------------------------------------------------ state

    def started(self, url: str) -> None:
        self.in_flight[url] += 1

    def finished(self, url: str) -> None:
        self.in_flight[url] -= 1

    def mark_down(self, url: str) -> None:
        """`url` failed (or stopped answering its health probe): no traffic, prefixes forgotten."""
        if self.up[url]:
            self.up[url] = False
            self._forget(url)

    def mark_up(self, url: str) -> None:
        self.up[url] = True

    def failed_over(self) -> None:
        self.num_failovers += 1

    def tree_blocks(self, url: str) -> int:
        """Prefix blocks recorded for `url`."""
        return self._blocks[url]

    # ------------------------------------------------------------------ prefix tree

    def _block_keys(self, ids: list[int]) -> list[tuple[int, ...]]:
        size = self.config.block_tokens
        return [tuple(ids[i:i + size]) for i in range(0, len(ids) - size + 1, size)]

    def _matched_tokens(self, ids: list[int]) -> dict[str, int]:
        """Server -> how many leading tokens of `ids` it was sent before."""
        matched: dict[str, int] = {}
        node = self._root
        for depth, key in enumerate(self._block_keys(ids), start=1):
            child = node.children.get(key)
            if child is None:
                break
            for url in child.seen:
                matched[url] = depth * self.config.block_tokens
            node = child
        return matched

    def _insert(self, ids: list[int], url: str, now: float) -> None:
        node = self._root
        for key in self._block_keys(ids):
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _Node()
                self._num_nodes += 1
            if url not in child.seen:
                self._blocks[url] += 1
            child.seen[url] = now
            node = child
        if self._num_nodes > self.config.max_tree_blocks:
            self._evict()

    def _forget(self, url: str) -> None:
        for node in self._walk(self._root):
            node.seen.pop(url, None)
        self._prune(self._root, cutoff=None)
        self._recount()

    def _evict(self) -> None:
        """Drop the least recently used half of the tree (a node goes with its subtree)."""
        stamps = sorted(_last_seen(n) for n in self._walk(self._root))
        self._prune(self._root, cutoff=stamps[len(stamps) // 2])
        self._recount()

    def _prune(self, node: _Node, cutoff: float | None) -> None:
        """Remove the nodes no server holds any more, or last used before `cutoff` (iterative:
        a long prompt makes a deep tree)."""
        stack = [node]
        while stack:
            current = stack.pop()
            for key, child in list(current.children.items()):
                if not child.seen or (cutoff is not None and _last_seen(child) < cutoff):
                    del current.children[key]
                else:
                    stack.append(child)

    def _recount(self) -> None:
        nodes = list(self._walk(self._root))
        self._num_nodes = len(nodes)
        self._blocks = dict.fromkeys(self.upstreams, 0)
        for node in nodes:
            for url in node.seen:
                self._blocks[url] += 1

    def _walk(self, node: _Node) -> list[_Node]:
        out: list[_Node] = []
        stack = list(node.children.values())
        while stack:
            current = stack.pop()
            out.append(current)
            stack.extend(current.children.values())
        return out


def _last_seen(node: _Node) -> float:
    return max(node.seen.values(), default=0.0)
