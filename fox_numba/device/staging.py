"""Bulk host<->device copies through mapped pinned staging buffers.

Uploads (feature tensors, parameters, RNG states) are cut into chunks; each chunk is written by the host
into one of two mapped buffers and copied device-to-device from there into the destination, so the host
writes chunk k+1 while chunk k is in flight. Downloads (parameters for a checkpoint, the ISV for a
report) go the other way. Both return once the data has arrived; neither may run inside a step body
(a captured graph would freeze a copy of stale bytes).

Ordering: the Stager's copies run on its own stream. Work already enqueued on another stream is not
ordered with them: a download could read a buffer before the kernel producing it (on the collect or
train stream) has run, and an upload could overwrite a buffer a kernel there is still reading. Pass that
stream as `after=` (one stream or several): the Stager records an event on each and makes its own
stream wait for it before the first copy. Work enqueued after an upload or download returns needs
nothing: both return only once their copies are complete.

Any dtype is copied as bytes, so record arrays (RNG states, snapshots) need no special path. The host
side of each chunk is copied by several threads (numpy releases the GIL for plain copies), because one
thread writes pinned memory several times slower than the DMA reads it out of mapped memory; the
measured rates of both halves and of the whole path are in tools/results/bench_device_h200.md
(tools/bench_device.py).
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from fox_numba.device.launch import LaunchError, active_trace
from fox_numba.device.memory import Mapped, copy_device, device_empty
from fox_numba.device.runtime import sync_event

Streams = Any  # a stream, or a tuple / list of streams

DEFAULT_CHUNK_BYTES = 64 << 20
DEFAULT_HOST_THREADS = min(8, os.cpu_count() or 1)
_MIN_SLICE_BYTES = 4 << 20  # below this a host copy is not split across threads


def _flat_bytes_device(arr: Any) -> Any:
    return arr.reshape(arr.size).view(np.uint8)


def _copy_slice(dst: np.ndarray, src: np.ndarray, start: int, stop: int) -> None:
    dst[start:stop] = src[start:stop]


class Stager:
    """Uploads and downloads through two mapped pinned chunks of `chunk_bytes` each, on `stream`."""

    def __init__(
        self, stream: Any, chunk_bytes: int = DEFAULT_CHUNK_BYTES, host_threads: int = DEFAULT_HOST_THREADS
    ) -> None:
        if chunk_bytes < 4 or chunk_bytes % 4:
            raise ValueError(f"chunk_bytes={chunk_bytes} must be a positive multiple of 4")
        self.stream = stream
        self.chunk_bytes = chunk_bytes
        self._buffers = (Mapped(chunk_bytes, np.uint8), Mapped(chunk_bytes, np.uint8))
        self._done = (sync_event(), sync_event())
        self._after = sync_event()
        self._threads = max(1, host_threads)
        self._pool = ThreadPoolExecutor(self._threads, "stager") if self._threads > 1 else None

    def _host_copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        """dst[:] = src for flat byte arrays, split across the host threads when it is large."""
        n = src.size
        parts = min(self._threads, n // _MIN_SLICE_BYTES)
        if self._pool is None or parts < 2:
            dst[:] = src
            return
        bounds = [n * k // parts for k in range(parts + 1)]
        for f in [self._pool.submit(_copy_slice, dst, src, a, b) for a, b in itertools.pairwise(bounds)]:
            f.result()

    def _check(self, host: np.ndarray, dev: Any) -> None:
        if active_trace() is not None:
            raise LaunchError("staging inside a step body: a captured graph would replay stale bytes")
        if tuple(host.shape) != tuple(dev.shape) or host.dtype != dev.dtype:
            raise ValueError(
                f"host {host.dtype}{tuple(host.shape)} and device {dev.dtype}{tuple(dev.shape)} differ"
            )

    def _wait_for(self, after: Streams) -> None:
        """Make the Stager's stream wait for the work enqueued so far on each stream of `after`."""
        if after is None:
            return
        for other in after if isinstance(after, (tuple, list)) else (after,):
            if other is self.stream:
                continue  # already in order
            self._after.record(other)
            self._after.wait(self.stream)  # the wait takes the event as recorded now, so one event serves all

    def _chunks(self, nbytes: int) -> list[tuple[int, int]]:
        return [(s, min(s + self.chunk_bytes, nbytes)) for s in range(0, nbytes, self.chunk_bytes)]

    def upload(self, src: np.ndarray, dst: Any, *, after: Streams = None) -> None:
        """Copy the host array `src` into the device array `dst` (same shape and dtype).

        `after`: the stream(s) whose kernels read or write `dst`; the copy waits for the work they have
        enqueued so far (without it, only the Stager's own stream is in order with the copy).
        """
        self._check(src, dst)
        self._wait_for(after)
        src_bytes = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        dst_bytes = _flat_bytes_device(dst)
        for k, (start, stop) in enumerate(self._chunks(src_bytes.size)):
            buf, done = self._buffers[k % 2], self._done[k % 2]
            if k >= 2:
                done.synchronize()  # the copy out of this buffer two chunks ago has finished
            n = stop - start
            self._host_copy(buf.host[:n], src_bytes[start:stop])
            copy_device(dst_bytes[start:stop], buf.device[:n], stream=self.stream)
            done.record(self.stream)
        self.stream.synchronize()

    def upload_new(self, src: np.ndarray) -> Any:
        """A new device array holding a copy of the host array `src`."""
        dst = device_empty(src.shape, src.dtype)
        self.upload(src, dst)
        return dst

    def download(self, src: Any, out: np.ndarray | None = None, *, after: Streams = None) -> np.ndarray:
        """Copy the device array `src` into `out` (a new host array if None) and return it.

        `after`: the stream(s) whose kernels produce `src`; the copy waits for the work they have enqueued
        so far (without it, only the Stager's own stream is in order with the copy).
        """
        if out is None:
            out = np.empty(src.shape, src.dtype)
        self._check(out, src)
        if not out.flags.c_contiguous:
            raise ValueError("download needs a C-contiguous output array")
        self._wait_for(after)
        out_bytes = out.reshape(-1).view(np.uint8)
        src_bytes = _flat_bytes_device(src)
        chunks = self._chunks(out_bytes.size)
        if not chunks:
            return out

        def drain(k: int) -> None:
            start, stop = chunks[k]
            self._done[k % 2].synchronize()
            self._host_copy(out_bytes[start:stop], self._buffers[k % 2].host[: stop - start])

        for k, (start, stop) in enumerate(chunks):
            buf = self._buffers[k % 2].device[: stop - start]
            copy_device(buf, src_bytes[start:stop], stream=self.stream)
            self._done[k % 2].record(self.stream)
            if k >= 1:
                drain(k - 1)  # the host copies chunk k-1 out while chunk k is in flight
        drain(len(chunks) - 1)
        return out
