"""The engine-local block tier: KV blocks in the pool's memory under a byte budget.

Least recently used goes first, with retention by customer tier: a block last used by a
priority-1 chat is kept over every priority-2 block while priority-1 blocks hold at most
``vip_share`` of the budget (beyond it their oldest go first, so VIP traffic cannot pin the
whole cache). A priority-2 hit on a VIP block leaves it in the VIP tier; a priority-1 hit on a
priority-2 block promotes it.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict

import numpy as np


class LocalBlocks:
    def __init__(self, budget_bytes: int, vip_share: float = 0.5):
        self.budget = max(0, int(budget_bytes))
        self.vip_share = vip_share
        self._tiers: dict[int, OrderedDict[bytes, np.ndarray]] = {1: OrderedDict(), 2: OrderedDict()}
        self._bytes = {1: 0, 2: 0}
        self._lock = threading.Lock()
        self.counts: Counter = Counter()  # hits, misses, inserted, evicted, evicted_vip

    def __len__(self) -> int:
        with self._lock:
            return len(self._tiers[1]) + len(self._tiers[2])

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes[1] + self._bytes[2]

    def _find(self, key: bytes) -> tuple[int, np.ndarray] | None:
        for tier in (1, 2):
            entry = self._tiers[tier].get(key)
            if entry is not None:
                return tier, entry
        return None

    def get(self, key: bytes, priority: int, count: bool = True) -> np.ndarray | None:
        """The block under ``key`` (touched), or None; ``count``: a lookup's hit or miss."""
        with self._lock:
            found = self._find(key)
            if found is None:
                self.counts["misses"] += count
                return None
            tier, kv = found
            self.counts["hits"] += count
            self._touch(key, tier, kv, priority)
            return kv

    def __contains__(self, key: bytes) -> bool:
        with self._lock:
            return self._find(key) is not None

    def put(self, key: bytes, kv: np.ndarray, priority: int) -> bool:
        """Keep ``kv`` under ``key`` (already there: touched). False if it cannot fit at all."""
        with self._lock:
            found = self._find(key)
            if found is not None:
                self._touch(key, *found, priority)
                return True
            if kv.nbytes > self.budget:
                return False
            tier = 1 if priority <= 1 else 2
            self._tiers[tier][key] = kv
            self._bytes[tier] += kv.nbytes
            self.counts["inserted"] += 1
            self._evict()
            return True

    def _touch(self, key: bytes, tier: int, kv: np.ndarray, priority: int) -> None:
        if priority <= 1 and tier == 2:  # promoted: kept like a VIP's from now on
            del self._tiers[2][key]
            self._bytes[2] -= kv.nbytes
            self._tiers[1][key] = kv
            self._bytes[1] += kv.nbytes
        else:
            self._tiers[tier].move_to_end(key)

    def _evict(self) -> None:
        while self._bytes[1] + self._bytes[2] > self.budget:
            vip_over = self._bytes[1] > self.vip_share * self.budget
            tier = 1 if (vip_over or not self._tiers[2]) else 2
            _, kv = self._tiers[tier].popitem(last=False)
            self._bytes[tier] -= kv.nbytes
            self.counts["evicted_vip" if tier == 1 else "evicted"] += 1

    def clear(self) -> None:
        with self._lock:
            for tier in (1, 2):
                self._tiers[tier].clear()
                self._bytes[tier] = 0
