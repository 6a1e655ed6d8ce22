"""Host memory the client keeps registered with the daemon: staging slabs for the tensors of
requests in flight, an arena for weights held across calls, and regions behind Client.empty()
arrays.

Registering a region costs a round trip to the daemon (and, on a GPU daemon, pinning), so none
of these is created per call: slabs are reused from a free list, weights live in arena chunks
until their module lets them go, and empty() regions live as long as their arrays.
"""

from __future__ import annotations

import bisect
import ctypes
from ctypes import byref, c_void_p

from convd._errors import Error

_ELIMIT = -14
_MIN_SLAB = 1 << 20
_MIN_CHUNK = 4 << 20
# Free slabs kept for reuse; more are unregistered.
_KEEP_SLABS = 8


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p <<= 1
    return p


class HostRegion:
    """One memfd region: the library's handle, its address here and its size."""

    __slots__ = ("handle", "addr", "size", "__weakref__")

    def __init__(self, handle: int, addr: int, size: int):
        self.handle = handle
        self.addr = addr
        self.size = size


def create_region(client, size: int) -> HostRegion:
    """convd_region_create under the client's lock (held by the caller). Raises Error."""
    lib = client._lib
    h = c_void_p()
    rc = lib.convd_region_create(client._h, size, byref(h))
    if rc != 0:
        raise client._error(rc)
    return HostRegion(h.value, lib.convd_region_data(h), size)


def free_region(client, region: HostRegion) -> None:
    if client._h is not None and region.handle:
        client._lib.convd_region_free(region.handle)
    region.handle = 0


class Slabs:
    """Staging slabs: one per request in flight that needs to copy a tensor in or out. A slab is
    at least 1 MiB and a power of two, so a stream of similar problems reuses a few."""

    def __init__(self, client):
        self.client = client
        self.free: list[HostRegion] = []
        self.all = 0

    def take(self, need: int) -> HostRegion:
        best = None
        for i, r in enumerate(self.free):
            if r.size >= need and (best is None or r.size < self.free[best].size):
                best = i
        if best is not None:
            return self.free.pop(best)
        size = max(_MIN_SLAB, _pow2(need))
        try:
            r = create_region(self.client, size)
        except Error as e:
            if e.status != _ELIMIT or not self.free:
                raise
            # The daemon's region or byte limit: give back what is idle and try once more.
            self.drop_free()
            r = create_region(self.client, size)
        self.all += 1
        return r

    def give(self, r: HostRegion) -> None:
        self.free.append(r)
        if len(self.free) > _KEEP_SLABS:
            smallest = min(range(len(self.free)), key=lambda i: self.free[i].size)
            free_region(self.client, self.free.pop(smallest))
            self.all -= 1

    def drop_free(self) -> None:
        for r in self.free:
            free_region(self.client, r)
            self.all -= 1
        self.free.clear()


class Block:
    """A piece of an arena chunk: where a held weight (and its bias) lives."""

    __slots__ = ("chunk", "offset", "size", "addr")

    def __init__(self, chunk, offset, size):
        self.chunk = chunk
        self.offset = offset
        self.size = size
        self.addr = chunk.region.addr + offset

    @property
    def region(self) -> int:
        return self.chunk.region.handle


class _Chunk:
    __slots__ = ("region", "holes")

    def __init__(self, region: HostRegion):
        self.region = region
        self.holes = [(0, region.size)]  # sorted (offset, size), merged on free


class Arena:
    """First-fit allocation of Blocks in chunks of at least 4 MiB, for weights that stay
    registered across calls without a region each (the daemon allows 256 regions a client)."""

    ALIGN = 256

    def __init__(self, client):
        self.client = client
        self.chunks: list[_Chunk] = []

    def alloc(self, size: int) -> Block:
        size = max(self.ALIGN, (size + self.ALIGN - 1) // self.ALIGN * self.ALIGN)
        for ch in self.chunks:
            for i, (off, n) in enumerate(ch.holes):
                if n >= size:
                    if n == size:
                        del ch.holes[i]
                    else:
                        ch.holes[i] = (off + size, n - size)
                    return Block(ch, off, size)
        ch = _Chunk(create_region(self.client, max(_MIN_CHUNK, _pow2(size))))
        self.chunks.append(ch)
        off, n = ch.holes[0]
        ch.holes[0] = (off + size, n - size)
        if ch.holes[0][1] == 0:
            ch.holes.clear()
        return Block(ch, off, size)

    def free(self, b: Block) -> None:
        ch = b.chunk
        if ch.region.handle == 0:
            return
        holes = ch.holes
        i = bisect.bisect_left(holes, (b.offset, 0))
        holes.insert(i, (b.offset, b.size))
        # Merge with the neighbours.
        if i + 1 < len(holes) and holes[i][0] + holes[i][1] == holes[i + 1][0]:
            holes[i] = (holes[i][0], holes[i][1] + holes[i + 1][1])
            del holes[i + 1]
        if i > 0 and holes[i - 1][0] + holes[i - 1][1] == holes[i][0]:
            holes[i - 1] = (holes[i - 1][0], holes[i - 1][1] + holes[i][1])
            del holes[i]
        if len(holes) == 1 and holes[0] == (0, ch.region.size):
            free_region(self.client, ch.region)
            self.chunks.remove(ch)

    def drop_all(self) -> None:
        for ch in self.chunks:
            free_region(self.client, ch.region)
        self.chunks.clear()


class EmptyRegions:
    """The regions behind Client.empty() arrays, sorted by address, so that a tensor that lies
    in one is referenced in place instead of copied."""

    def __init__(self):
        self.starts: list[int] = []
        self.regions: list[HostRegion] = []

    def __len__(self):
        return len(self.starts)

    def add(self, r: HostRegion) -> None:
        i = bisect.bisect_left(self.starts, r.addr)
        self.starts.insert(i, r.addr)
        self.regions.insert(i, r)

    def remove(self, r: HostRegion) -> None:
        i = bisect.bisect_left(self.starts, r.addr)
        if i < len(self.starts) and self.regions[i] is r:
            del self.starts[i]
            del self.regions[i]

    def find(self, addr: int, nbytes: int):
        """(region handle, offset) when [addr, addr + nbytes) lies in one region, else None."""
        i = bisect.bisect_right(self.starts, addr) - 1
        if i < 0:
            return None
        r = self.regions[i]
        if addr + nbytes <= r.addr + r.size and r.handle:
            return r.handle, addr - r.addr
        return None


def region_array(region: HostRegion):
    """A ctypes char array over the region's memory: the buffer numpy arrays are built on, and
    the object whose death says no array uses the region any more."""
    return (ctypes.c_char * region.size).from_address(region.addr)
