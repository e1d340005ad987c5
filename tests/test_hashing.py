import mmh3
import numpy as np
import pytest

from runtime.hashing import NULL_HASH, choice, hash_keys, hash_one, mix64


def test_strings_are_murmur3_64() -> None:
    h = hash_keys(["the", "git", "ünïcode"])
    for k, x in zip(["the", "git", "ünïcode"], h.tolist(), strict=True):
        assert x == mmh3.hash64(k.encode(), 0, signed=False)[0]
    assert h.dtype == np.uint64


def test_ints_vectorized_equal_scalar() -> None:
    ints = np.array([0, 1, -1, 2**62, -(2**63)], dtype=np.int64)
    assert hash_keys(ints).tolist() == [hash_one(int(i)) for i in ints]
    assert hash_keys(list(ints.tolist())).tolist() == hash_keys(ints).tolist()


def test_none_is_one_group_and_bool_rejected() -> None:
    assert hash_keys([None, None]).tolist() == [int(NULL_HASH)] * 2
    with pytest.raises(TypeError):
        hash_one(1.5)


def test_choices_are_independent() -> None:
    h = hash_keys(np.arange(100_000, dtype=np.int64))
    a, b = choice(h, 1) % np.uint64(10), choice(h, 2) % np.uint64(10)
    # independent choices collide ~1/n of the time
    assert 0.08 < np.mean(a == b) < 0.12
    assert np.all(mix64(np.zeros(1, np.uint64)) == 0)  # fmix64 fixes 0: why h + i*STEP, i >= 1
