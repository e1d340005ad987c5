"""Fast checks of scripts/reproduce_papers.py (experiments 1 and 2 on small streams).

Structural facts that a broken scheme, baseline or metric would violate.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import paper_baselines as pb  # noqa: E402
import reproduce_papers as rp  # noqa: E402


@pytest.fixture(scope="module")
def skewed() -> rp.Stream:
    return rp.zipf_stream(50_000, 5_000, 1.2)


@pytest.fixture(scope="module")
def words() -> rp.Stream:
    return rp.words_stream(rp.DEFAULT_WORDS, limit=50_000)


@pytest.fixture(scope="module")
def exp1(skewed, words):
    specs = rp.available(rp.EXP1_SCHEMES)
    df = rp.exp1_bins([skewed, words], lambda s: [10, 100], specs)
    return df.set_index(["stream", "scheme", "bins"])


def test_exp1_kg_is_memory_optimal_and_sg_balanced(exp1):
    for st in ("zipf-1.2", "words"):
        for b in (10, 100):
            assert exp1.loc[(st, "KG", b), "replication"] == 1.0
            assert exp1.loc[(st, "CH", b), "replication"] == 1.0
            assert exp1.loc[(st, "SG", b), "imb_rel"] <= b / 50_000 + 1e-12
            assert exp1.loc[(st, "SG", b), "replication"] > exp1.loc[(st, "PKG", b), "replication"]


def test_exp1_pkg_beats_kg_and_stays_within_two_workers(exp1):
    for st in ("zipf-1.2", "words"):
        for b in (10, 100):
            assert exp1.loc[(st, "PKG", b), "imb_rel"] < exp1.loc[(st, "KG", b), "imb_rel"]
            assert 1.0 <= exp1.loc[(st, "PKG", b), "replication"] <= 2.0


def test_exp1_porc_imbalance_bounded_by_eps(exp1):
    m = 50_000
    for st in ("zipf-1.2", "words"):
        for b in (10, 100):
            for eps in (0.3, 0.01):
                # max bin <= ceil((1 + eps) m / B): relative imbalance <= eps + B / m
                assert exp1.loc[(st, f"PoRC e={eps}", b), "imb_rel"] <= eps + b / m + 1e-12
            # smaller eps: tighter balance, more memory
            assert (exp1.loc[(st, "PoRC e=0.01", b), "replication"]
                    >= exp1.loc[(st, "PoRC e=0.3", b), "replication"])


def test_exp1_kg_imbalance_at_least_the_hot_key_floor(exp1, skewed):
    b = 100
    assert exp1.loc[("zipf-1.2", "KG", b), "imb_rel"] >= skewed.p1 * b - 1 - 1e-9


def test_exp2_table_ordering(words, skewed):
    df = rp.exp2_table([skewed, words], [5, 50]).set_index(["stream", "workers", "method"])
    for st in ("zipf-1.2", "words"):
        for n in (5, 50):
            kg = df.loc[(st, n, "Hashing"), "avg_imb"]
            assert df.loc[(st, n, "PKG-G"), "avg_imb"] < kg
            assert df.loc[(st, n, "PKG-L5"), "avg_imb"] < kg
            assert df.loc[(st, n, "Hashing"), "replication"] == 1.0
            # without key splitting every key lives on one worker
            for meth in ("On-Greedy", "Off-Greedy", "PoTC"):
                assert df.loc[(st, n, meth), "replication"] == 1.0
            assert df.loc[(st, n, "PKG-G"), "replication"] <= 2.0
    # Off-Greedy sees the whole stream: its final balance beats hashing's
    assert df.loc[("words", 5, "Off-Greedy"), "final_imb"] < df.loc[("words", 5, "Hashing"), "final_imb"]


def test_baselines_on_a_tiny_stream():
    ids = np.array([0, 0, 0, 1, 2, 0, 1, 3], dtype=np.int64)
    # On-Greedy: key 0 -> 0, key 1 -> 1 (0 is loaded), key 2 -> 1? loads (3, 1): -> 1
    assert pb.on_greedy(ids, 4, 2).tolist() == [0, 0, 0, 1, 1, 0, 1, 1]
    # Off-Greedy (LPT): freq 0:4, 1:2, 2:1, 3:1 -> 0 on w0, 1 on w1, 2 on w1, 3 on w1
    assert pb.off_greedy(ids, 4, 2).tolist() == [0, 0, 0, 1, 1, 0, 1, 1]
    t, imb = pb.imbalance_trace(np.array([0, 0, 1, 1], dtype=np.int32), 2, 4)
    assert t.tolist() == [1, 2, 3, 4] and imb.tolist() == [0.5, 1.0, 0.5, 0.0]
    assert pb.replication(ids, np.zeros(len(ids), dtype=np.int32), 4, 2) == 1.0


def test_quick_cli_writes_doc_block(tmp_path, monkeypatch):
    monkeypatch.setitem(rp.EXPERIMENTS, "1", lambda args: "### stub\n")
    assert rp.main(["--only", "1", "--out", str(tmp_path)]) == 0
    rp.write_block(tmp_path, "exp1", "### replaced")
    text = (tmp_path / "reproduction.md").read_text()
    assert text.count("BEGIN:exp1") == 1 and "### replaced" in text and "stub" not in text
