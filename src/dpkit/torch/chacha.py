"""ChaCha20 in torch integer operations: the CSPRNG words of :mod:`dpkit.noise.source`, on a device.

The block function is RFC 8439's (20 rounds), vectorised over blocks: the 16-word states of all
blocks are held as four (4, blocks) int64 tensors — rows 0–3, 4–7, 8–11, 12–15 — so a column
round is one quarter round on whole tensors and a diagonal round the same after permuting the
rows of the last three. Words are kept in int64 (``torch.uint32`` has no addition or shifts on
the CPU in torch 2.13): every value is below 2^55, so nothing overflows and every operation is
defined. Masking to 32 bits is done only where it matters — before each rotation (additions and
exclusive-ors commute with reduction mod 2^32) and at the end.

The stream is the one ``cryptography`` (OpenSSL) produces for the same key: its 16-byte "nonce"
is a 32-bit little-endian block counter followed by RFC 8439's 96-bit nonce; 64-bit word i is
keystream bytes 8i..8i+7 read little-endian, the layout :class:`~dpkit.noise.source.SecureSource`
writes. A stream that passes 2^32 blocks (2^35 words) moves to the next nonce (the first nonce
word plus one, mod 2^32, per 2^32 blocks) with the counter from 0, so no (nonce, counter) pair
repeats within a stream (at most 2^67 words, enforced); OpenSSL never has to wrap its counter.

Measured on the 2-core benchmark machine (torch 2.13 CPU): this kernel gives about 15 million
64-bit words a second on the CPU, OpenSSL about 800 million (through :class:`ChaChaStream`, which
reuses one buffer of zeros; ``SecureSource.words`` about 480 million), so on CPU tensors
:class:`TorchSource` takes the identical words from OpenSSL (``kernel=False``) and uses the
kernel on other devices. The same kernel in int32 with wrapping additions ran about twice as
fast (31 million words a second) but would rest on signed overflow wrapping inside torch's
kernels, which C++ leaves undefined; ``torch.uint32`` has no addition or shifts on the CPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from numpy.typing import NDArray

from dpkit.errors import InvalidParameterError
from dpkit.noise.source import SecureSource, resolve_rng

__all__ = ["ChaChaStream", "TorchSource", "chacha20_blocks", "keystream"]

_SIGMA = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)  # "expand 32-byte k"
_MASK = 0xFFFFFFFF
_SEGMENT = 1 << 32  # blocks per nonce: the 32-bit counter's range
_MAX_WORDS = 8 * _SEGMENT * _SEGMENT  # then the first nonce word would come round again
_ZEROS = bytes(1 << 20)  # plaintext for OpenSSL: encrypting zeros yields the keystream
_READ_BLOCKS = 1 << 10  # a reader encrypts 64 KiB of zeros per call: the plaintext stays in cache
_B_PERM, _B_BACK = [1, 2, 3, 0], [3, 0, 1, 2]  # rows 4–7 → 5, 6, 7, 4 and back (d: the reverse)
_C_PERM = [2, 3, 0, 1]  # rows 8–11 → 10, 11, 8, 9 (its own inverse)
_KERNEL_BLOCKS = 1 << 20  # blocks per kernel call on accelerators: (4, 2^20) int64 tensors of 32 MiB
_CPU_KERNEL_BLOCKS = 1 << 14  # on the CPU: tensors that stay in cache (measured ~2x faster)


def _rotate(z: torch.Tensor, r: int) -> None:
    """z ← rotl32(z mod 2^32, r) in place, in the low 32 bits (bits above stay, below 2^48)."""
    z.bitwise_and_(_MASK)
    t = z >> (32 - r)
    z.bitwise_left_shift_(r).bitwise_or_(t)


def _quarter(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> None:
    """RFC 8439's quarter round on every column of (a, b, c, d), in place, modulo 2^32.

    b and d leave each rotation below 2^48; a and c gain less than 2^48 per addition, 40
    additions per block: everything stays below 2^55.
    """
    a.add_(b)
    d.bitwise_xor_(a)
    _rotate(d, 16)
    c.add_(d)
    b.bitwise_xor_(c)
    _rotate(b, 12)
    a.add_(b)
    d.bitwise_xor_(a)
    _rotate(d, 8)
    c.add_(d)
    b.bitwise_xor_(c)
    _rotate(b, 7)


def _check_key(key: bytes, nonce: bytes) -> None:
    if not isinstance(key, bytes) or len(key) != 32:
        raise InvalidParameterError("key", "(not shown)", "32 bytes")
    if not isinstance(nonce, bytes) or len(nonce) != 12:
        raise InvalidParameterError("nonce", "(not shown)", "12 bytes")


def chacha20_blocks(key: bytes, nonce: bytes, counter: int, blocks: int, device: torch.device | str) -> torch.Tensor:
    """The ChaCha20 blocks with counters ``counter``, …, ``counter + blocks − 1``: an int64
    tensor of shape (blocks, 16) holding the 32-bit keystream words, on ``device``."""
    _check_key(key, nonce)
    if not (counter >= 0 and blocks >= 0 and counter + blocks <= _SEGMENT):
        raise InvalidParameterError("counter", counter, "a block counter range inside [0, 2**32)")
    words = np.frombuffer(key + nonce, dtype="<u4").astype(np.int64)
    init = torch.empty((16, blocks), dtype=torch.int64, device=device)
    init[0:12] = torch.tensor([*_SIGMA, *words[:8].tolist()], dtype=torch.int64, device=device)[:, None]
    init[12] = torch.arange(counter, counter + blocks, dtype=torch.int64, device=device)
    init[13:16] = torch.tensor(words[8:].tolist(), dtype=torch.int64, device=device)[:, None]
    perm, back, swap = (torch.tensor(p, device=device) for p in (_B_PERM, _B_BACK, _C_PERM))
    a, b, c, d = (init[i : i + 4].clone() for i in (0, 4, 8, 12))
    for _ in range(10):  # 10 double rounds: columns, then diagonals
        _quarter(a, b, c, d)
        b, c, d = b.index_select(0, perm), c.index_select(0, swap), d.index_select(0, back)
        _quarter(a, b, c, d)
        b, c, d = b.index_select(0, back), c.index_select(0, swap), d.index_select(0, perm)
    return torch.cat((a, b, c, d)).add_(init).bitwise_and_(_MASK).T


def _pair(blocks: torch.Tensor) -> torch.Tensor:
    """(blocks, 16) 32-bit words → (blocks·8,) 64-bit words (low word first), as int64."""
    lo, hi = blocks[:, 0::2], blocks[:, 1::2]
    signed_hi = hi - ((hi >> 31) << 32)  # the two's-complement value of the high word
    return (signed_hi * (1 << 32) + lo).reshape(-1)  # in [−2^63, 2^63): no overflow


def _segment_nonce(nonce: bytes, segment: int) -> bytes:
    first = (int.from_bytes(nonce[:4], "little") + segment) & _MASK
    return first.to_bytes(4, "little") + nonce[4:]


def _segments(block: int, count: int) -> Iterator[tuple[int, int, int]]:
    """(segment, counter, blocks) pieces of the block range [block, block + count)."""
    while count:
        seg, ctr = divmod(block, _SEGMENT)
        m = min(count, _SEGMENT - ctr)
        yield seg, ctr, m
        block += m
        count -= m


def _openssl_blocks(key: bytes, nonce: bytes, block: int, count: int) -> NDArray[np.uint64]:
    out = np.empty(8 * count, dtype=np.uint64)
    buf = out.data.cast("B")
    pos = 0
    for seg, ctr, m in _segments(block, count):
        iv = ctr.to_bytes(4, "little") + _segment_nonce(nonce, seg)
        enc = Cipher(algorithms.ChaCha20(key, iv), mode=None).encryptor()
        end = pos + 64 * m
        while pos < end:
            step = min(end - pos, len(_ZEROS))
            enc.update_into(memoryview(_ZEROS)[:step], buf[pos : pos + step])
            pos += step
    return out


def _kernel_blocks(key: bytes, nonce: bytes, block: int, count: int, device: torch.device) -> torch.Tensor:
    parts = []
    step = _CPU_KERNEL_BLOCKS if device.type == "cpu" else _KERNEL_BLOCKS
    for seg, ctr, m in _segments(block, count):
        seg_nonce = _segment_nonce(nonce, seg)
        for s in range(0, m, step):
            parts.append(_pair(chacha20_blocks(key, seg_nonce, ctr + s, min(step, m - s), device)))
    if not parts:
        return torch.empty(0, dtype=torch.int64, device=device)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def keystream(
    key: bytes, nonce: bytes, start: int, n: int, device: torch.device | str = "cpu", *, kernel: bool = True
) -> torch.Tensor:
    """64-bit words ``start``, …, ``start + n − 1`` of the stream of (key, nonce), as int64 on
    ``device``: from the torch kernel, or (``kernel=False``) from OpenSSL on the host."""
    _check_key(key, nonce)
    dev = torch.device(device)
    first, skip = divmod(start, 8)
    count = (skip + n + 7) // 8
    if kernel:
        return _kernel_blocks(key, nonce, first, count, dev)[skip : skip + n]
    host = _openssl_blocks(key, nonce, first, count)[skip : skip + n]
    return torch.from_numpy(host.view(np.int64)).to(dev)


class ChaChaStream:
    """One ChaCha20 keystream read in order as 64-bit words: a numpy
    :class:`~dpkit.noise.source.RandomSource` (its words come from OpenSSL).

    :class:`TorchSource` reads the same stream on a device; the two share the position, so the
    rare lanes a device sampler settles on the host read the words that follow, exactly as a
    numpy sampler reading this stream would.
    """

    def __init__(self, key: bytes, nonce: bytes, position: int = 0) -> None:
        _check_key(key, nonce)
        self._key, self._nonce, self._position = key, nonce, int(position)

    @classmethod
    def keyed(cls, rng: object = None) -> ChaChaStream:
        """A fresh stream keyed from the operating system (``None`` or a
        :class:`~dpkit.noise.source.SecureSource`), from six words of a seeded source or numpy
        ``Generator`` (reproducible, tests only), or ``rng`` itself if it is a stream."""
        if isinstance(rng, ChaChaStream):
            return rng
        src = resolve_rng(rng)
        if type(src) is SecureSource:
            return cls(os.urandom(32), os.urandom(12))
        raw = np.asarray(src.words(6), dtype=np.uint64).astype("<u8").tobytes()
        return cls(raw[:32], raw[32:44])

    @property
    def key(self) -> bytes:
        return self._key

    @property
    def nonce(self) -> bytes:
        return self._nonce

    @property
    def position(self) -> int:
        """How many words have been read."""
        return self._position

    def take(self, n: int) -> int:
        """Reserve the next ``n`` words; returns the position of the first."""
        if n < 0:
            raise InvalidParameterError("n", n, "an integer >= 0")
        if self._position + n > _MAX_WORDS:  # 2^32 nonces of 2^32 blocks: no (nonce, counter) repeats
            raise InvalidParameterError("n", n, "at most 2**67 words per stream")
        start = self._position
        self._position += n
        return start

    def words(self, n: int) -> NDArray[np.uint64]:
        return self.words_at(self.take(n), n)

    def take_blocks(self, blocks: int) -> int:
        """Reserve ``blocks`` whole 64-byte blocks (8 words each) after skipping to the next block
        boundary (the skipped words are never used); returns the index of the first block."""
        if blocks < 0:
            raise InvalidParameterError("blocks", blocks, "an integer >= 0")
        self.take(-self._position % 8)
        return self.take(8 * blocks) // 8

    def reader(self, block: int) -> Callable[..., NDArray[np.uint64]]:
        """Reads consecutive reserved blocks from ``block`` on: each call ``read(m, out=None)``
        returns the next m blocks as 8·m words (in ``out`` if given). One OpenSSL context per reader (none per call), so a thread
        reading its own range in pieces pays the key setup once."""
        return _BlockReader(self._key, self._nonce, block).read

    def words_at(self, start: int, n: int) -> NDArray[np.uint64]:
        """Words ``start``, …, ``start + n − 1`` (reserved with :meth:`take`); reads no state, so
        threads may read disjoint ranges at once (OpenSSL runs without the GIL)."""
        first, skip = divmod(start, 8)
        return _openssl_blocks(self._key, self._nonce, first, (skip + n + 7) // 8)[skip : skip + n]

    def __repr__(self) -> str:
        return f"ChaChaStream(position={self._position})"  # never the key


class _BlockReader:
    """Consecutive blocks of one stream through one OpenSSL context (renewed per 2^32 blocks)."""

    def __init__(self, key: bytes, nonce: bytes, block: int) -> None:
        self._key, self._nonce, self._block = key, nonce, block
        self._enc: Any = None
        self._end = 0  # the first block past the current context's segment

    def read(self, m: int, out: NDArray[np.uint64] | None = None) -> NDArray[np.uint64]:
        """The next m blocks as 8·m words, into ``out`` (at least 8·m words) if given."""
        out = np.empty(8 * m, dtype=np.uint64) if out is None else out[: 8 * m]
        buf = out.data.cast("B")
        pos = 0
        while m:
            if self._enc is None or self._block >= self._end:
                seg, ctr = divmod(self._block, _SEGMENT)
                iv = ctr.to_bytes(4, "little") + _segment_nonce(self._nonce, seg)
                self._enc = Cipher(algorithms.ChaCha20(self._key, iv), mode=None).encryptor()
                self._end = (seg + 1) * _SEGMENT
            step = min(m, self._end - self._block, _READ_BLOCKS)
            self._enc.update_into(memoryview(_ZEROS)[: 64 * step], buf[pos : pos + 64 * step])
            pos += 64 * step
            self._block += step
            m -= step
        return out


class TorchSource:
    """CSPRNG words on a device: ``words(n)`` returns the next ``n`` 64-bit words of a ChaCha20
    stream as an int64 tensor (the uint64 bit patterns) on ``device``.

    Keyed from the operating system by default (a fresh key and nonce per source: create one
    per release); ``rng`` may be a numpy ``Generator`` or a seeded source (reproducible key, tests
    only) or a :class:`ChaChaStream` to continue. ``host`` is that stream as a numpy source: it
    continues after the last word handed out, so CPU code and device code can share one stream.
    ``kernel``: compute the words with torch operations on the device (default: on every device
    but the CPU, where OpenSSL computes the same words an order of magnitude faster).
    """

    def __init__(self, device: torch.device | str = "cpu", rng: object = None, *, kernel: bool | None = None) -> None:
        self.device = torch.device(device)
        self.stream = ChaChaStream.keyed(rng)
        self.kernel = self.device.type != "cpu" if kernel is None else bool(kernel)

    @property
    def host(self) -> ChaChaStream:
        return self.stream

    def words(self, n: int) -> torch.Tensor:
        start = self.stream.take(n)
        return keystream(self.stream.key, self.stream.nonce, start, n, self.device, kernel=self.kernel)

    def __repr__(self) -> str:
        return f"TorchSource(device={str(self.device)!r}, kernel={self.kernel}, {self.stream!r})"
