"""A key/value cache for a running batch of sequences of different lengths.

Layout: for every decoder layer one key and one value tensor of shape
``[rows, kv_heads, capacity, head_dim]``. Row ``r`` holds sequence ``r`` of the
running batch; ``lengths[r]`` positions of it are filled. Rows ``0..n-1`` are
always the running ones (kept compact), so a decode step reads the views
``k[:n, :, :max_len]`` without gathering anything. When a sequence leaves, the
last row is moved into its place (one copy of one sequence, once).

Storage grows by doubling (rows and positions) and is freed when the batch
empties, so memory follows the current load, not the largest one ever seen.
"""

from __future__ import annotations

from typing import Any


class SavedRow:
    """One sequence's cache, out of the batch (a bistream sequence waiting for text)."""

    def __init__(self, length: int, k: list[Any], v: list[Any]) -> None:
        self.length, self.k, self.v = length, k, v


class BatchedKV:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: Any, device: Any,
                 min_rows: int = 4, min_positions: int = 256) -> None:
        self.layers = layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = device
        self.min_rows = min_rows
        self.min_positions = min_positions
        self.k: list[Any] = []
        self.v: list[Any] = []
        self.lengths: list[int] = []  # filled positions per running row

    # -- shape -------------------------------------------------------------------------------
    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def capacity(self) -> tuple[int, int]:
        """(rows, positions) allocated now; (0, 0) when nothing is held. Safe from other threads."""
        k = self.k  # one read: the owner may replace the list meanwhile
        if not k:
            return (0, 0)
        return (k[0].shape[0], k[0].shape[2])

    def nbytes(self) -> int:
        k, v = self.k, self.v
        return sum(t.numel() * t.element_size() for t in list(k) + list(v))

    def reserve(self, rows: int, positions: int) -> None:
        """Make room for ``rows`` sequences of ``positions`` positions (copying what is held)."""
        import torch

        have_rows, have_pos = self.capacity
        if rows <= have_rows and positions <= have_pos:
            return
        new_rows = max(have_rows, self.min_rows)
        while new_rows < rows:
            new_rows *= 2
        new_pos = max(have_pos, self.min_positions)
        while new_pos < positions:
            new_pos *= 2
        shape = (new_rows, self.kv_heads, new_pos, self.head_dim)
        used_rows, used_pos = self.rows, max(self.lengths, default=0)
        # all new tensors first, then swap: an out-of-memory error halfway leaves the old cache whole
        grown = []
        for cache in (self.k, self.v):
            fresh_layers = []
            for i in range(self.layers):
                fresh = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if cache and used_rows and used_pos:
                    fresh[:used_rows, :, :used_pos] = cache[i][:used_rows, :, :used_pos]
                fresh_layers.append(fresh)
            grown.append(fresh_layers)
        self.k, self.v = grown

    # -- rows ------------------------------------------------------------------------------------
    def add_row(self, length: int) -> int:
        """Append a row that will hold ``length`` positions; returns its index."""
        return self.add_rows([length])[0]

    def add_rows(self, lengths: list[int]) -> list[int]:
        """Append one row per entry of ``lengths`` (its positions), growing the storage once; their indices."""
        self.reserve(self.rows + len(lengths), max(lengths) + 1)  # raises before anything is added
        first = self.rows
        self.lengths.extend(int(n) for n in lengths)
        return list(range(first, self.rows))

    def remove_row(self, row: int) -> int | None:
        """Drop ``row``; the last row moves into its place. Returns the index that moved (or None)."""
        last = self.rows - 1
        moved = None
        if row != last:
            n = self.lengths[last]
            for cache in (self.k, self.v):
                for t in cache:
                    t[row, :, :n] = t[last, :, :n]
            self.lengths[row] = n
            moved = last
        self.lengths.pop()
        if not self.lengths:
            self.clear()
        return moved

    def swap_rows(self, a: int, b: int) -> None:
        """Exchange rows ``a`` and ``b`` (their filled positions and lengths): the running rows stay compact."""
        if a == b:
            return
        la, lb = self.lengths[a], self.lengths[b]
        for cache in (self.k, self.v):
            for t in cache:
                held = t[a, :, :la].clone()
                t[a, :, :lb] = t[b, :, :lb]
                t[b, :, :la] = held
        self.lengths[a], self.lengths[b] = lb, la

    def clear(self) -> None:
        self.k, self.v, self.lengths = [], [], []

    # -- writes ----------------------------------------------------------------------------------
    def write_prefix(self, layer: int, row: int, k: Any, v: Any) -> None:
        """Store a new row's prefill keys/values ``[kv_heads, T, head_dim]`` at positions 0..T-1."""
        t = k.shape[1]
        self.k[layer][row, :, :t] = k
        self.v[layer][row, :, :t] = v

    def write_step(self, layer: int, positions: Any, k: Any, v: Any, rows: Any = None) -> None:
        """Store ``k``/``v`` ``[n, kv_heads, head_dim]``: entry j at row ``rows[j]``, position ``positions[j]``.

        A decode step writes one new position per running row (``rows`` default 0..n-1); a
        batched prefill writes every real position of its new rows. ``positions`` and ``rows``
        are device index tensors: no host sync.
        """
        import torch

        if rows is None:
            rows = torch.arange(k.shape[0], device=k.device)
        self.k[layer][rows, :, positions] = k
        self.v[layer][rows, :, positions] = v

    def write_span(self, layer: int, row: int, start: int, k: Any, v: Any) -> None:
        """Store ``[kv_heads, T, head_dim]`` keys/values of ``row`` at positions start..start+T-1."""
        t = k.shape[1]
        self.k[layer][row, :, start:start + t] = k
        self.v[layer][row, :, start:start + t] = v

    def rows_view(self, layer: int, first: int, count: int, length: int) -> tuple[Any, Any]:
        """Rows ``first..first+count-1``, positions ``0..length-1`` (views, no copy)."""
        end = first + count
        return self.k[layer][first:end, :, :length], self.v[layer][first:end, :, :length]

    def snapshot(self, row: int) -> SavedRow:
        """A copy of ``row``'s filled keys/values, to take it out of the batch and restore it later."""
        n = self.lengths[row]
        return SavedRow(n, [t[row, :, :n].clone() for t in self.k], [t[row, :, :n].clone() for t in self.v])

    def restore(self, row: int, saved: SavedRow) -> None:
        for i in range(self.layers):
            self.write_span(i, row, 0, saved.k[i], saved.v[i])

    def view(self, layer: int, length: int, rows: int | None = None) -> tuple[Any, Any]:
        """Rows ``0..rows-1`` (default: every running row), positions ``0..length-1`` (views, no copy)."""
        n = self.rows if rows is None else rows
        return self.k[layer][:n, :, :length], self.v[layer][:n, :, :length]
