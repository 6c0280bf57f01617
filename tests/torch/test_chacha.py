"""ChaCha20 in torch: bit for bit the keystream of OpenSSL (through ``cryptography``)."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms  # noqa: E402

from dpkit.errors import InvalidParameterError  # noqa: E402
from dpkit.noise.source import SecureSource, SeededSource  # noqa: E402
from dpkit.torch import chacha  # noqa: E402
from dpkit.torch.chacha import ChaChaStream, TorchSource, chacha20_blocks, keystream  # noqa: E402

KEYS = [bytes(32), bytes(range(32)), bytes.fromhex("ff" * 32), os.urandom(32)]
NONCES = [bytes(12), bytes.fromhex("000000090000004a00000000"), bytes.fromhex("ff" * 12), os.urandom(12)]


def openssl(key: bytes, nonce: bytes, counter: int, nbytes: int) -> bytes:
    """cryptography's keystream: its 16-byte nonce is the LE block counter, then the nonce."""
    iv = counter.to_bytes(4, "little") + nonce
    return Cipher(algorithms.ChaCha20(key, iv), mode=None).encryptor().update(b"\0" * nbytes)


def test_rfc8439_block_function_test_vector() -> None:
    # RFC 8439, section 2.3.2: key 00..1f, nonce 00:00:00:09:00:00:00:4a:00:00:00:00, counter 1.
    want = bytes.fromhex(
        "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
        "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
    )
    got = chacha20_blocks(bytes(range(32)), NONCES[1], 1, 1, "cpu")
    assert got.shape == (1, 16) and got.dtype == torch.int64
    assert got.numpy().astype("<u4").tobytes() == want
    assert openssl(bytes(range(32)), NONCES[1], 1, 64) == want


@pytest.mark.parametrize("key", KEYS, ids=["zero", "ramp", "ones", "random"])
@pytest.mark.parametrize("nonce", NONCES, ids=["zero", "rfc", "ones", "random"])
def test_blocks_equal_openssl_for_keys_nonces_and_counters(key: bytes, nonce: bytes) -> None:
    for counter, blocks in [(0, 1), (0, 5), (1, 3), (12345, 17), (2**31 - 1, 4), (2**32 - 9, 9)]:
        got = chacha20_blocks(key, nonce, counter, blocks, "cpu").numpy()
        assert ((got >= 0) & (got < 2**32)).all()
        assert got.astype("<u4").tobytes() == openssl(key, nonce, counter, 64 * blocks)


@pytest.mark.parametrize("kernel", [True, False], ids=["torch", "openssl"])
@pytest.mark.parametrize("start", [0, 1, 7, 8, 9, 800, 8 * 2**20 - 3])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000])
def test_words_equal_openssl_at_every_offset_and_length(kernel: bool, start: int, n: int) -> None:
    """64-bit word i = keystream bytes 8i..8i+7, little-endian (SecureSource's layout), across
    block boundaries, for any start and length."""
    key, nonce = KEYS[3], NONCES[3]
    first, skip = divmod(start, 8)
    raw = openssl(key, nonce, first, 64 * ((skip + n + 7) // 8 + 1))
    want = np.frombuffer(raw, dtype="<u8")[skip : skip + n]
    got = keystream(key, nonce, start, n, "cpu", kernel=kernel)
    assert got.dtype == torch.int64 and got.shape == (n,)
    assert np.array_equal(got.numpy().view(np.uint64), want)


def test_kernel_calls_are_split_and_joined_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chacha, "_KERNEL_BLOCKS", 3)
    monkeypatch.setattr(chacha, "_CPU_KERNEL_BLOCKS", 3)
    key, nonce = KEYS[2], NONCES[2]
    got = keystream(key, nonce, 5, 100, kernel=True).numpy().view(np.uint64)
    want = np.frombuffer(openssl(key, nonce, 0, 64 * 14), dtype="<u8")[5:105]
    assert np.array_equal(got, want)


def test_a_stream_moves_to_the_next_nonce_after_2_32_blocks() -> None:
    """Past 2^32 blocks the counter restarts at 0 under the nonce whose first word is one more:
    no (nonce, counter) pair repeats, OpenSSL never wraps, and kernel and host agree."""
    key, nonce = KEYS[3], bytes.fromhex("ffffffff") + NONCES[3][4:]
    start = (2**32 - 2) * 8 + 3
    host = ChaChaStream(key, nonce, position=start).words(40)
    dev = keystream(key, nonce, start, 40, kernel=True).numpy().view(np.uint64)
    assert np.array_equal(host, dev)
    before = np.frombuffer(openssl(key, nonce, 2**32 - 2, 128), dtype="<u8")
    after = np.frombuffer(openssl(key, bytes(4) + nonce[4:], 0, 64 * 4), dtype="<u8")  # 0xffffffff + 1 = 0
    assert np.array_equal(host, np.concatenate([before, after])[3:43])


@pytest.mark.parametrize("kernel", [True, False], ids=["torch", "openssl"])
def test_torch_source_host_and_device_read_one_stream(kernel: bool) -> None:
    key, nonce = KEYS[1], NONCES[3]
    src = TorchSource("cpu", ChaChaStream(key, nonce), kernel=kernel)
    parts = [src.words(13).numpy().view(np.uint64), src.host.words(2), src.words(0).numpy().view(np.uint64)]
    parts += [src.words(70).numpy().view(np.uint64), src.host.words(1)]
    assert src.stream.position == 86
    want = np.frombuffer(openssl(key, nonce, 0, 64 * 11), dtype="<u8")[:86]
    assert np.array_equal(np.concatenate(parts), want)
    # the numpy source over the same stream gives the same words
    assert np.array_equal(ChaChaStream(key, nonce).words(86), want)


def test_torch_source_defaults() -> None:
    src = TorchSource()
    assert src.device == torch.device("cpu") and src.kernel is False
    assert TorchSource("cpu", kernel=True).kernel is True
    w = src.words(5)
    assert w.dtype == torch.int64 and w.device.type == "cpu"


def test_keys_come_from_the_os_by_default_and_from_a_seed_for_tests() -> None:
    # None and the secure source: a fresh OS key per source (never equal)
    a, b, c = ChaChaStream.keyed(), ChaChaStream.keyed(None), ChaChaStream.keyed(SecureSource())
    assert len({a.key, b.key, c.key}) == 3 and len({a.nonce, b.nonce, c.nonce}) == 3
    # a seeded generator or source: a reproducible key, from its next six words
    s1 = TorchSource("cpu", np.random.default_rng(5))
    s2 = TorchSource("cpu", SeededSource(np.random.default_rng(5)))
    assert s1.stream.key == s2.stream.key and s1.stream.nonce == s2.stream.nonce
    assert torch.equal(s1.words(100), s2.words(100))
    assert TorchSource("cpu", np.random.default_rng(6)).stream.key != s1.stream.key
    raw = np.random.default_rng(5).integers(0, 2**64 - 1, size=6, dtype=np.uint64, endpoint=True)
    assert s1.stream.key + s1.stream.nonce == raw.astype("<u8").tobytes()[:44]
    # a stream is continued, not re-keyed
    stream = ChaChaStream(KEYS[0], NONCES[0], position=8)
    assert TorchSource("cpu", stream).stream is stream


def test_keys_never_show() -> None:
    src = TorchSource("cpu", ChaChaStream(KEYS[1], NONCES[1]))
    assert KEYS[1].hex() not in repr(src) and repr(KEYS[1]) not in repr(src)
    assert "position=0" in repr(src.stream)


def test_bad_keys_and_requests_are_refused() -> None:
    with pytest.raises(InvalidParameterError, match="key"):
        ChaChaStream(bytes(31), bytes(12))
    with pytest.raises(InvalidParameterError, match="nonce"):
        ChaChaStream(bytes(32), bytes(16))
    with pytest.raises(InvalidParameterError, match="counter"):
        chacha20_blocks(bytes(32), bytes(12), 2**32 - 1, 2, "cpu")
    with pytest.raises(InvalidParameterError, match="rng"):
        TorchSource("cpu", 42)
    with pytest.raises(InvalidParameterError, match="n="):
        ChaChaStream(bytes(32), bytes(12)).words(-1)


def test_block_readers_read_the_reserved_range() -> None:
    """take_blocks skips to a block boundary and reserves whole blocks; a reader returns those
    blocks' words in pieces, across the 2^32-block segment boundary too, equal to words_at."""
    stream = ChaChaStream(bytes(range(32)), bytes(range(12)), position=8 * (2**32 - 5) - 3)
    first = stream.take_blocks(12)
    assert first == 2**32 - 5 and stream.position == 8 * (first + 12)
    read = stream.reader(first)
    got = np.concatenate([read(1), read(7), read(4)])
    assert np.array_equal(got, stream.words_at(8 * first, 96))
    with pytest.raises(InvalidParameterError, match="blocks"):
        stream.take_blocks(-1)
