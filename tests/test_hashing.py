import mmh3
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime import hashing
from runtime.hashing import NULL_HASH, choice, hash_arrow, hash_keys, hash_one, mix64


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


# --- hash_arrow: MurmurHash3 over Arrow buffers, bit-identical to hash_keys ---

STRING_TYPES = [pa.string(), pa.large_string()]
ALL_VARBINARY = STRING_TYPES + [pa.binary(), pa.large_binary(), pa.string_view(),
                                pa.binary_view()]
texts = st.text(st.characters(codec="utf-8"))  # any code point but surrogates
keys_or_none = st.lists(st.one_of(texts, st.none()), max_size=80)


def ref(xs: list[str | bytes | None]) -> list[int]:
    """Straight mmh3 on each value (no fast path involved)."""
    return [int(NULL_HASH) if x is None else
            mmh3.hash64(x.encode() if isinstance(x, str) else x, 0, signed=False)[0]
            for x in xs]


@settings(deadline=None, max_examples=150)
@given(xs=keys_or_none, t=st.sampled_from(STRING_TYPES))
def test_hash_arrow_equals_hash_keys(xs: list[str | None], t: pa.DataType) -> None:
    h = hash_arrow(pa.array(xs, type=t))
    assert h.dtype == np.uint64 and h.shape == (len(xs),)
    assert h.tolist() == hash_keys(xs).tolist() == ref(xs)


@settings(deadline=None, max_examples=150)
@given(xs=keys_or_none, t=st.sampled_from(STRING_TYPES), data=st.data())
def test_hash_arrow_sliced(xs: list[str | None], t: pa.DataType, data: st.DataObject) -> None:
    a = data.draw(st.integers(0, len(xs)))
    b = data.draw(st.integers(a, len(xs)))
    arr = pa.array(xs, type=t).slice(a, b - a)
    assert arr.offset == a or b == a
    assert hash_arrow(arr).tolist() == hash_keys(xs[a:b]).tolist() == ref(xs[a:b])


@settings(deadline=None, max_examples=100)
@given(parts=st.lists(keys_or_none, max_size=5), t=st.sampled_from(STRING_TYPES))
def test_hash_arrow_chunked(parts: list[list[str | None]], t: pa.DataType) -> None:
    flat = [x for p in parts for x in p]
    arr = pa.chunked_array([pa.array(p, type=t) for p in parts], type=t)
    assert hash_arrow(arr).tolist() == hash_keys(arr).tolist() == ref(flat)


@pytest.mark.parametrize("t", ALL_VARBINARY, ids=str)
def test_hash_arrow_every_tail_length(t: pa.DataType) -> None:
    # lengths 0..40 cover every tail length (0..15) and block counts 0..2, at
    # every byte alignment of the value's start in the data buffer
    xs: list[str | None] = ["x" * n for n in range(41)] + ["é" * n for n in range(21)]
    xs += ["".join(chr(0x41 + (i * 7 + n) % 26) for i in range(n)) for n in range(41)]
    xs += ["", None, "🙂" * 9, "\x00" * 17]
    arr = pa.array(xs, type=t)
    assert hash_arrow(arr).tolist() == ref(xs)
    for a in (1, 3, 7, 8, 13):  # sliced: start mid buffers
        assert hash_arrow(arr.slice(a)).tolist() == ref(xs[a:])


def test_hash_arrow_edge_cases() -> None:
    big = "ab€" * 350_000  # ~1.4 MB of UTF-8
    for t in STRING_TYPES:
        assert hash_arrow(pa.array([big, "", big[1:]], type=t)).tolist() == ref([big, "", big[1:]])
        assert hash_arrow(pa.array([None] * 9, type=t)).tolist() == [int(NULL_HASH)] * 9
        assert hash_arrow(pa.array([], type=t)).dtype == np.uint64
        assert len(hash_arrow(pa.array([], type=t))) == 0
        assert hash_arrow(pa.array([""], type=t)).tolist() == ref([""])
        assert len(hash_arrow(pa.chunked_array([], type=t))) == 0
    assert hash_arrow(pa.array([None, None])).tolist() == [int(NULL_HASH)] * 2  # null type


def test_hash_arrow_binary_and_dictionary() -> None:
    xs: list[str | None] = ["a", None, "git", "ünï", "a", "x" * 33]
    for t in ALL_VARBINARY:
        assert hash_arrow(pa.array(xs, type=t)).tolist() == ref(xs), t
    bs = [b"\xff\x00", None, b""]
    assert hash_arrow(pa.array(bs, type=pa.binary())).tolist() == hash_keys(bs).tolist()
    d = pa.array(xs).dictionary_encode()
    assert hash_arrow(d).tolist() == hash_keys(d.to_pylist()).tolist() == ref(xs)
    dn = pa.array(xs).dictionary_encode(null_encoding="encode")
    assert hash_arrow(dn).tolist() == ref(xs)
    di = pa.array([5, None, -1, 5]).dictionary_encode()
    assert hash_arrow(di).tolist() == hash_keys([5, None, -1, 5]).tolist()


@pytest.mark.parametrize("t", [pa.int8(), pa.int32(), pa.int64(), pa.uint32(), pa.uint64()],
                         ids=str)
def test_hash_arrow_integers(t: pa.DataType) -> None:
    hi = 2**64 - 1 if t == pa.uint64() else 100
    xs: list[int | None] = [0, 1, 7, 100, hi]
    if pa.types.is_signed_integer(t):
        xs += [-1, -100]
    arr = pa.array(xs, type=t)
    assert hash_arrow(arr).tolist() == hash_keys(xs).tolist() == hash_keys(arr.to_numpy()).tolist()
    with_nulls = xs + [None]
    assert hash_arrow(pa.array(with_nulls, type=t)).tolist() == hash_keys(with_nulls).tolist()
    assert hash_arrow(pa.array(with_nulls, type=t).slice(2)).tolist() == \
        hash_keys(with_nulls[2:]).tolist()


def test_hash_arrow_other_types_keep_errors() -> None:
    with pytest.raises(TypeError):
        hash_arrow(pa.array([True, False]))
    with pytest.raises(TypeError):
        hash_keys(pa.array([True, False]))
    with pytest.raises(TypeError):
        hash_keys(np.array([True, False]))
    with pytest.raises(TypeError):
        hash_arrow(pa.array([1.5]))
    assert hash_arrow(pa.array([], type=pa.float64())).tolist() == []


def test_hash_arrow_100k_keys_against_mmh3() -> None:
    rng = np.random.default_rng(7)
    alphabet = np.array(list("abcxyz019 _-é€ßü🙂"), dtype=object)
    lens = rng.integers(0, 48, size=100_000)
    xs = ["".join(alphabet[rng.integers(0, len(alphabet), size=n)].tolist()) for n in lens]
    xs[::1000] = [f"k{i}" for i in range(100)]
    want = [mmh3.hash64(x.encode("utf-8"), 0, signed=False)[0] for x in xs]
    assert hash_arrow(pa.array(xs)).tolist() == want
    assert hash_arrow(pa.array(xs, type=pa.large_string()).slice(3)).tolist() == want[3:]
    assert hash_keys(xs).tolist() == want  # the list fast path
    assert hash_keys(np.array(xs, dtype=object)).tolist() == want


def test_hash_keys_str_sequences_fast_path_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    xs: list[object] = [f"w{i}" for i in range(200)] + [None, "", "ünï"]
    fast = hash_keys(xs).tolist()
    obj = hash_keys(np.array(xs, dtype=object)).tolist()
    tup = hash_keys(tuple(xs)).tolist()
    monkeypatch.setattr(hashing, "_ARROW_MIN", 10**9)  # force the scalar loop
    assert fast == obj == tup == hash_keys(xs).tolist()
    monkeypatch.undo()
    # what the loop rejects is still rejected (pyarrow would accept some of it)
    for bad, err in ((bytearray(b"x"), TypeError), (float("nan"), TypeError),
                     (True, TypeError), ("\ud800", UnicodeEncodeError)):
        with pytest.raises(err):
            hash_keys([*xs, bad])
        with pytest.raises(err):
            hash_keys(np.array([*xs, bad], dtype=object))
    mixed = [*xs, b"raw", 5, np.int64(-3)]  # mixed types: the loop, same hashes as before
    assert hash_keys(mixed).tolist() == fast + [hash_one(b"raw"), hash_one(5), hash_one(-3)]
