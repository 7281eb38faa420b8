"""Prefix cache: full pages of computed tokens outlive their requests and are found again by the
tokens that lead to them.

A page's key is a SHA-256 chain over its request's tokens up to the page's end, so a key names a
whole prefix (the page's tokens after everything before them), and the pages form a tree: a
shared system prompt is one chain that many requests hold. A request computes its pages' keys
once, as its tokens become known (`page_keys`), so matching a long prompt again is one dict
lookup a page. Both pools follow one page id, so a hit reuses the MLA latents and the indexer
keys of every layer at once. A node counts the requests holding it; a request holds every node
of its chain, so a node nobody holds has no held descendants and can go. Eviction takes the least
recently released leaf first (then its parent may become a leaf), and only when the free list is
empty, so cached pages cost nothing until the memory is wanted.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from array import array
from dataclasses import dataclass

from dsa_backend.cache.allocator import OutOfPages, PageAllocator


def page_keys(token_ids: list[int], page_size: int, previous: bytes = b"") -> list[bytes]:
    """The keys of token_ids' whole pages; previous: the key of the page before the first."""
    keys = []
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        previous = hashlib.sha256(previous + array("i", token_ids[start:start + page_size]).tobytes()).digest()
        keys.append(previous)
    return keys


@dataclass(eq=False)
class _Node:
    page: int
    key: bytes
    parent: _Node | None
    refs: int = 1                    # requests holding the page
    children: int = 0                # cached pages whose parent this is
    released_at: int = 0


class PrefixCache:
    """Cached full pages over `allocator`; requests hold their chain's nodes while they run."""

    def __init__(self, allocator: PageAllocator, enabled: bool = True):
        """enabled False: nothing is matched or cached, and a request's pages are freed when it ends."""
        self.allocator = allocator
        self.enabled = enabled
        self._nodes: dict[bytes, _Node] = {}
        self._by_page: dict[int, _Node] = {}
        self._leaves: list[tuple[int, int]] = []   # (released_at, page) heap; stale entries are skipped
        self._clock = itertools.count(1)
        self.num_unheld = 0                         # cached pages no request holds: free for the asking

    @property
    def num_cached(self) -> int:
        return len(self._by_page)

    @property
    def num_available(self) -> int:
        """Pages an allocation can get: the free list and every cached page nobody holds."""
        return self.allocator.num_free + self.num_unheld

    def match(self, keys: list[bytes]) -> list[int]:
        """The cached pages of the longest run of leading page keys, now held by the caller."""
        nodes = self._cached_run(keys)
        for node in nodes:
            self._hold(node)
        return [node.page for node in nodes]

    def peek(self, keys: list[bytes]) -> tuple[int, int]:
        """What match(keys) would hold, without holding it: (its pages, how many of them nobody
        holds now, which num_available counts and holding them takes away)."""
        nodes = self._cached_run(keys)
        return len(nodes), sum(node.refs == 0 for node in nodes)

    def _cached_run(self, keys: list[bytes]) -> list[_Node]:
        """The nodes of the longest run of leading page keys in the cache."""
        nodes = []
        for key in keys if self.enabled else ():
            node = self._nodes.get(key)
            if node is None:
                break
            nodes.append(node)
        return nodes

    def insert(self, pages: list[int], num_held: int, keys: list[bytes]) -> int:
        """Cache pages[num_held:len(keys)], whose keys are keys[num_held:], behind the request's
        held chain pages[:num_held]. Where another request cached the same prefix first, the
        request takes that page and frees its own copy. Returns how many leading pages the
        request now holds."""
        if not self.enabled:
            return num_held
        for i in range(num_held, len(keys)):
            node = self._nodes.get(keys[i])
            if node is None:
                parent = self._nodes[keys[i - 1]] if i else None
                node = self._nodes[keys[i]] = self._by_page[pages[i]] = _Node(pages[i], keys[i], parent)
                if parent:
                    parent.children += 1
            else:  # the same tokens after the same prefix: the same KV
                self._hold(node)
                self.allocator.free([pages[i]])
                pages[i] = node.page
        return max(num_held, len(keys))

    def release(self, pages: list[int], num_held: int) -> None:
        """A request lets go of its pages: the held chain pages[:num_held] stays cached, the rest is freed."""
        now = next(self._clock)
        for page in pages[:num_held]:
            node = self._by_page[page]
            node.refs -= 1
            if node.refs == 0:
                self.num_unheld += 1
                node.released_at = now
                if node.children == 0:
                    heapq.heappush(self._leaves, (now, page))
        self.allocator.free(pages[num_held:])

    def allocate(self, n: int) -> list[int]:
        """n pages from the free list, evicting unheld cached pages when it runs short."""
        if n > self.num_available:
            raise OutOfPages(f"asked for {n} pages, {self.num_available} available of {self.allocator.num_pages}")
        while self.allocator.num_free < n:
            self._evict_one()
        return self.allocator.allocate(n)

    def _evict_one(self) -> None:
        while True:
            released_at, page = heapq.heappop(self._leaves)
            node = self._by_page.get(page)
            if node and node.refs == 0 and node.children == 0 and node.released_at == released_at:
                break
        del self._nodes[node.key], self._by_page[page]
        self.num_unheld -= 1
        parent = node.parent
        if parent:
            parent.children -= 1
            if parent.children == 0 and parent.refs == 0:
                heapq.heappush(self._leaves, (parent.released_at, parent.page))
        self.allocator.free([page])

    def _hold(self, node: _Node) -> None:
        if node.refs == 0:
            self.num_unheld -= 1  # its heap entry, if any, goes stale
        node.refs += 1
