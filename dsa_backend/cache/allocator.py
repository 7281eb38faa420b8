"""Page allocator shared by the MLA latent pool and the indexer-key pool (one page id, both pools)."""

from __future__ import annotations


class OutOfPages(RuntimeError):
    """Raised when an allocation asks for more pages than are free."""


class PageAllocator:
    """Free list of page ids 0..num_pages-1; allocation is all-or-nothing."""

    def __init__(self, num_pages: int):
        if num_pages <= 0:
            raise ValueError(f"num_pages must be positive, got {num_pages}")
        self.num_pages = num_pages
        # Popping from the end hands out low page ids first, which keeps tests readable.
        self._free = list(range(num_pages - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPages(f"asked for {n} pages, {len(self._free)} free of {self.num_pages}")
        pages = [self._free.pop() for _ in range(n)]
        self._used.update(pages)
        return pages

    def free(self, pages: list[int]) -> None:
        for page in pages:
            if page not in self._used:
                raise ValueError(f"page {page} is not allocated (double free?)")
            self._used.remove(page)
            self._free.append(page)


def pages_needed(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)
