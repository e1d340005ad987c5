"""Reproduce the papers' load-balancing tables and figures with our schemes.

    .venv/bin/python scripts/reproduce_papers.py [--only 1,2,3,4] [--quick]
        [--out docs] [--words PATH]

1. CG paper, Table 1 / Fig 4 / Fig 6: normalized imbalance and replication vs
   number of bins (virtual workers), count-based, Zipf streams + word stream.
2. PKG paper, Table 2: fraction of average imbalance for W = 5..100 workers:
   hashing, static PoTC, On-/Off-Greedy, PKG global and local (S sources).
3. CG paper, Fig 8 / Fig 12 (simulator): 3 of 10 workers 5x faster, ~80%
   load; then capacities change twice at constant total.
4. FISH paper (simulator): execution time relative to SG and replication
   relative to KG over 16..128 workers on an evolving Zipf and the word stream.

Each experiment prints its table and, with ``--out DIR``, rewrites its block
(between ``<!-- BEGIN:expN -->`` / ``<!-- END:expN -->``) in
``DIR/reproduction.md`` and its plots in ``DIR/img/``; the hand-written text
around the blocks is kept. Deterministic: every stream and scheme is seeded.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

import paper_baselines as pb  # noqa: E402

from runtime.grouping import SCHEMES, make_grouping  # noqa: E402
from runtime.hashing import hash_keys  # noqa: E402
from runtime.inputs.generators import key_ids, zipf_cdf  # noqa: E402

DEFAULT_WORDS = ROOT / "data" / "gitgit-words-1m.parquet"
SEED = 0

# --------------------------------------------------------------------------
# The papers' own numbers, quoted from their text (docs/reproduction.md cites them)
# --------------------------------------------------------------------------

#: CG paper, Table 1: "Normalized imbalance when varying the number of virtual
#: workers for the Wikipedia (WP) and Twitter (TW) datasets. We set the value
#: of eps = 0.3 for PORC and CH." Columns 10^1..10^4 bins.
CG_TABLE1 = {
    "WP": {"KG": [0.8, 9.15, 93, 931], "PKG": [8e-7, 3.67, 45.59, 464],
           "PoTC": [8e-7, 8e-6, 9e-5, 1e-3], "SG": [4e-7, 3e-6, 4e-6, 2.8e-4],
           "PoRC": [0.3] * 4, "CH": [0.3] * 4},
    "TW": {"KG": [2.2, 25, 246, 2469], "PKG": [1.52, 11.34, 22, 1233],
           "PoTC": [9.5e-8, 2e-6, 2e-5, 3e-4], "SG": [0, 2e-7, 6e-6, 4e-5],
           "PoRC": [0.3] * 4, "CH": [0.3] * 4},
}
CG_TABLE1_BINS = [10, 100, 1000, 10_000]

#: PKG paper, Table 2: "Fraction of average imbalance with different numbers
#: of workers for the WP and TW datasets." (PKG here uses global load info.)
PKG_TABLE2_COLS = ["PKG", "Off-Greedy", "On-Greedy", "PoTC", "Hashing"]
PKG_TABLE2 = {
    "WP": {5: [3.7e-8, 3.7e-8, 3.6e-7, 7.3e-7, 6.4e-2],
           10: [1.3e-7, 4.1e-8, 6.4e-3, 7.8e-3, 7.8e-2],
           50: [2.7e-2, 7.4e-2, 7.4e-2, 7.4e-2, 9.2e-2],
           100: [3.7e-2, 8.3e-2, 8.3e-2, 8.3e-2, 9.2e-2]},
    "TW": {5: [3.4e-10, 3.4e-10, 7.2e-9, 1.9e-5, 3.5e-2],
           10: [1.4e-9, 6e-10, 7.9e-8, 4.3e-6, 3.2e-2],
           50: [2.3e-9, 6.7e-3, 1.0e-2, 1.2e-2, 2.0e-2],
           100: [3.4e-3, 1.7e-2, 1.7e-2, 1.7e-2, 2.8e-2]},
}
#: p1 (share of the most frequent key) of the papers' datasets (PKG Table 1).
PAPER_P1 = {"WP": 0.0932, "TW": 0.0267}


# --------------------------------------------------------------------------
# Streams
# --------------------------------------------------------------------------


@dataclass
class Stream:
    """A key stream as dense key ids plus one 64-bit hash per key id."""

    name: str
    ids: np.ndarray  # int64[m], key id per message
    key_hashes: np.ndarray  # uint64[n_keys]
    label: str = ""

    @property
    def n_keys(self) -> int:
        return len(self.key_hashes)

    @property
    def msg_hashes(self) -> np.ndarray:
        return self.key_hashes[self.ids]

    @property
    def p1(self) -> float:
        return float(np.bincount(self.ids).max()) / len(self.ids)

    @property
    def distinct(self) -> int:
        return int(np.count_nonzero(np.bincount(self.ids, minlength=self.n_keys)))


def zipf_stream(messages: int, n_keys: int, skew: float, seed: int = SEED,
                name: str | None = None) -> Stream:
    ids = key_ids(0, messages, n_keys=n_keys, skew=skew, seed=seed)
    return Stream(name or f"zipf-{skew:g}", ids, hash_keys(np.arange(n_keys, dtype=np.int64)),
                  label=f"Zipf z={skew:g}, {n_keys:,} keys, {messages:,} msgs")


def words_stream(path: Path, limit: int | None = None) -> Stream:
    df = pd.read_parquet(path, columns=["key"])
    keys = df["key"].to_numpy()
    if limit:
        keys = keys[:limit]
    codes, uniques = pd.factorize(keys)
    return Stream("words", codes.astype(np.int64), hash_keys(list(uniques)),
                  label=f"words ({path.name}, {len(codes):,} msgs, {len(uniques):,} keys)")


def zipf_skew_for_p1(p1: float, n_keys: int) -> float:
    """The Zipf exponent whose top key has probability ``p1`` over ``n_keys`` keys."""
    lo, hi = 0.01, 4.0
    for _ in range(60):
        z = (lo + hi) / 2
        if zipf_cdf(n_keys, z)[0] < p1:
            lo = z
        else:
            hi = z
    return round((lo + hi) / 2, 3)


# --------------------------------------------------------------------------
# Formatting and docs
# --------------------------------------------------------------------------


def fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if x == 0:
        return "0"
    ax = abs(x)
    if 0.01 <= ax < 1000:
        return f"{x:.3g}"
    if 1000 <= ax < 1e6:
        return f"{x:.0f}"
    return f"{x:.1e}"


def md_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in header]] + [[c if isinstance(c, str) else fmt(c) for c in r]
                                          for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
             for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


DOC_HEADER = """# Reproducing the papers

Generated blocks (between `BEGIN`/`END` markers) are rewritten by
`scripts/reproduce_papers.py --out docs`; the text around them is hand-written.
"""


def write_block(out: Path, key: str, content: str) -> None:
    """Replace the ``key`` block of ``out/reproduction.md`` (append it if missing)."""
    doc = out / "reproduction.md"
    text = doc.read_text() if doc.exists() else DOC_HEADER
    begin, end = f"<!-- BEGIN:{key} -->", f"<!-- END:{key} -->"
    block = f"{begin}\n{content.rstrip()}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.write_text(text)


def run_header(args: argparse.Namespace, exp: str) -> str:
    cmd = f"`.venv/bin/python scripts/reproduce_papers.py --only {exp}"
    if args.quick:
        cmd += " --quick"
    if args.words != DEFAULT_WORDS:
        cmd += f" --words {args.words}"
    cmd += f" --out {args.out}`" if args.out else "`"
    return f"Command: {cmd}  \nRun: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}"


def progress(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="run", leave=False, file=sys.stderr)


# --------------------------------------------------------------------------
# Experiment 1: CG Table 1 / Fig 4 / Fig 6 (count-based)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class SchemeSpec:
    label: str
    name: str
    params: tuple[tuple[str, float], ...] = ()

    def build(self, n_workers: int, bins: int | None = None):
        p = dict(self.params)
        if self.name == "porc":
            p["bins"] = bins or n_workers
        return make_grouping(self.name, n_workers, seed=SEED, **p)


EXP1_SCHEMES = [
    SchemeSpec("KG", "kg"), SchemeSpec("PKG", "pkg"), SchemeSpec("PoTC", "potc"),
    SchemeSpec("SG", "sg"), SchemeSpec("PoRC e=0.3", "porc", (("eps", 0.3),)),
    SchemeSpec("PoRC e=0.01", "porc", (("eps", 0.01),)), SchemeSpec("CH", "ch"),
    SchemeSpec("CHBL e=0.3", "chbl", (("eps", 0.3),)),
    SchemeSpec("CHBL e=0.01", "chbl", (("eps", 0.01),)),
]


def available(specs: Sequence[SchemeSpec]) -> list[SchemeSpec]:
    return [s for s in specs if s.name in SCHEMES]


def route_bins(spec: SchemeSpec, stream: Stream, n_bins: int) -> np.ndarray:
    """Route the whole stream with ``n_bins`` bins as the workers (one source)."""
    return spec.build(n_bins, bins=n_bins).route(stream.msg_hashes)


def exp1_bins(streams: Sequence[Stream], bins_for: Callable[[Stream], Sequence[int]],
              specs: Sequence[SchemeSpec], bar=None) -> pd.DataFrame:
    """CG Table 1 / Fig 4: imbalance and replication with bins as workers."""
    rows = []
    for st in streams:
        for b in bins_for(st):
            for spec in specs:
                t0 = time.perf_counter()
                w = route_bins(spec, st, b)
                rel, per_m = pb.final_imbalance(w, b)
                rows.append({"stream": st.name, "scheme": spec.label, "bins": b,
                             "imb_rel": rel, "imb_m": per_m,
                             "replication": pb.replication(st.ids, w, st.n_keys, b),
                             "secs": time.perf_counter() - t0})
                if bar is not None:
                    bar.update(1)
    return pd.DataFrame(rows)


def exp1_workers(stream: Stream, workers: Sequence[int], specs: Sequence[SchemeSpec],
                 vw_per_worker: int = 10, bar=None) -> pd.DataFrame:
    """CG Fig 6: n workers x 10 virtual workers (bins); bin b belongs to worker b mod n."""
    rows = []
    for n in workers:
        b = n * vw_per_worker
        for spec in specs:
            w = (route_bins(spec, stream, b) % n).astype(np.int32)
            rel, per_m = pb.final_imbalance(w, n)
            rows.append({"stream": stream.name, "scheme": spec.label, "workers": n,
                         "imb_rel": rel, "imb_m": per_m,
                         "replication": pb.replication(stream.ids, w, stream.n_keys, n)})
            if bar is not None:
                bar.update(1)
    return pd.DataFrame(rows)


def pivot(df: pd.DataFrame, col: str, value: str) -> tuple[list[str], list[list[object]]]:
    p = df.pivot(index="scheme", columns=col, values=value)
    order = [s for s in dict.fromkeys(df["scheme"])]
    p = p.reindex(order)
    header = ["scheme"] + [f"{c:,}" for c in p.columns]
    return header, [[s] + [float(v) for v in p.loc[s]] for s in p.index]


def plot_exp1(df: pd.DataFrame, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams = list(dict.fromkeys(df["stream"]))
    fig, axes = plt.subplots(2, len(streams), figsize=(3.2 * len(streams), 6), squeeze=False)
    for j, st in enumerate(streams):
        d = df[df["stream"] == st]
        for scheme in dict.fromkeys(d["scheme"]):
            s = d[d["scheme"] == scheme].sort_values("bins")
            k = list(dict.fromkeys(d["scheme"])).index(scheme)
            style = {"marker": "o", "ms": 3, "ls": ["-", "--", ":"][k % 3], "label": scheme}
            axes[0, j].plot(s["bins"], np.maximum(s["imb_rel"], 1e-9), **style)
            axes[1, j].plot(s["bins"], s["replication"], **style)
        axes[0, j].set(xscale="log", yscale="log", title=st)
        axes[1, j].set(xscale="log", yscale="log", xlabel="bins (virtual workers)")
    axes[0, 0].set_ylabel("(max - mean) / mean  (0 drawn at 1e-9)")
    axes[1, 0].set_ylabel("replication (KG = 1)")
    axes[0, -1].legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def experiment1(args: argparse.Namespace) -> str:
    specs = available(EXP1_SCHEMES)
    missing = [s.label for s in EXP1_SCHEMES if s.name not in SCHEMES]
    m = 100_000 if args.quick else 1_000_000
    skews = [0.8, 1.6] if args.quick else [0.4, 0.8, 1.2, 1.6, 2.0]
    zipf = [zipf_stream(m, 100_000, z) for z in skews]
    words = words_stream(args.words, limit=100_000 if args.quick else None)
    zipf_bins = [10, 100] if args.quick else [10, 100, 1000]
    word_bins = [10, 100, 1000] if args.quick else CG_TABLE1_BINS
    fig6_workers = [5, 10, 50, 100]
    total = len(specs) * (len(zipf) * len(zipf_bins) + len(word_bins) + len(fig6_workers))
    bar = progress(total, "exp1 CG Table 1")
    d_zipf = exp1_bins(zipf, lambda s: zipf_bins, specs, bar)
    d_words = exp1_bins([words], lambda s: word_bins, specs, bar)
    d_fig6 = exp1_workers(words, fig6_workers, specs, bar=bar)
    bar.close()

    out = [f"### 1. CG Table 1 / Fig 4 / Fig 6: imbalance and memory vs bins\n\n"
           f"{run_header(args, '1')}\n"]
    if missing:
        out.append(f"Schemes not yet in the registry (skipped): {', '.join(missing)}.\n")
    out.append(f"Word stream: {words.label}, p1 = {words.p1:.2%}. "
               "Imbalance `(max - mean) / mean` at the end of the stream (the form the "
               "paper's Table 1 uses); divide by the number of bins for "
               "`(max - mean) / m`. One source, bins as workers.\n")
    h, r = pivot(d_words, "bins", "imb_rel")
    # what a single hot key alone forces (KG puts it on one bin, PKG on two)
    r += [["(p1 B - 1)"] + [words.p1 * b - 1 for b in word_bins],
          ["(p1 B / 2 - 1)"] + [words.p1 * b / 2 - 1 for b in word_bins]]
    out.append(f"**Ours, word stream, imbalance `(max - mean) / mean`** (last two rows: the "
               f"floor one hot key alone imposes on KG and PKG):\n\n{md_table(h, r)}\n")
    h, r = pivot(d_words, "bins", "imb_m")
    out.append(f"**Ours, word stream, imbalance `(max - mean) / m`:**\n\n{md_table(h, r)}\n")
    h, r = pivot(d_words, "bins", "replication")
    out.append(f"**Ours, word stream, replication (memory cost, KG = 1):**\n\n"
               f"{md_table(h, r)}\n")
    for ds in ("WP", "TW"):
        rows = [[k] + v for k, v in CG_TABLE1[ds].items()]
        out.append(f"**Paper, Table 1, {ds} (p1 = {PAPER_P1[ds]:.2%} per PKG Table 1):**\n\n"
                   f"{md_table(['scheme'] + [f'{b:,}' for b in CG_TABLE1_BINS], rows)}\n")
    for st in zipf:
        d = d_zipf[d_zipf["stream"] == st.name]
        h, r = pivot(d, "bins", "imb_rel")
        h2, r2 = pivot(d, "bins", "replication")
        hh = ["scheme"] + [f"imb {c}" for c in h[1:]] + [f"repl {c}" for c in h2[1:]]
        rr = [a + b[1:] for a, b in zip(r, r2, strict=True)]
        out.append(f"**Ours, {st.label} (p1 = {st.p1:.2%}): imbalance `(max - mean) / mean` "
                   f"and replication:**\n\n{md_table(hh, rr)}\n")
    h, r = pivot(d_fig6, "workers", "imb_rel")
    h2, r2 = pivot(d_fig6, "workers", "replication")
    hh = ["scheme"] + [f"imb n={c}" for c in h[1:]] + [f"repl n={c}" for c in h2[1:]]
    rr = [a + b[1:] for a, b in zip(r, r2, strict=True)]
    out.append("**Ours, Fig 6 setup (word stream; n workers x 10 virtual workers, bin b -> "
               "worker b mod n; imbalance `(max - mean) / mean` and replication over "
               f"workers):**\n\n{md_table(hh, rr)}\n")
    if args.out:
        img = args.out / "img"
        img.mkdir(parents=True, exist_ok=True)
        plot_exp1(pd.concat([d_zipf, d_words]), img / "cg_table1.png",
                  "CG Table 1 / Fig 4 reproduction: imbalance and replication vs bins")
        out.append("![imbalance and replication vs bins](img/cg_table1.png)\n")
    text = "\n".join(out)
    print(text)
    return text


# --------------------------------------------------------------------------
# Experiment 2: PKG Table 2 (count-based)
# --------------------------------------------------------------------------

EXP2_METHODS = ["PKG-G", "PKG-L5", "PKG-L10", "Off-Greedy", "On-Greedy", "PoTC", "Hashing"]


def route_method(method: str, st: Stream, n: int) -> np.ndarray:
    if method == "PKG-G":
        return pb.pkg_sources(st.msg_hashes, n, 1)
    if method.startswith("PKG-L"):
        return pb.pkg_sources(st.msg_hashes, n, int(method[5:]))
    if method == "Off-Greedy":
        return pb.off_greedy(st.ids, st.n_keys, n)
    if method == "On-Greedy":
        return pb.on_greedy(st.ids, st.n_keys, n)
    if method == "PoTC":
        return pb.static_potc(st.ids, st.key_hashes, n)
    if method == "Hashing":
        return make_grouping("kg", n, seed=SEED).route(st.msg_hashes)
    raise ValueError(method)


def exp2_table(streams: Sequence[Stream], workers: Sequence[int],
               methods: Sequence[str] = EXP2_METHODS, n_points: int = 200,
               bar=None) -> pd.DataFrame:
    rows = []
    for st in streams:
        for n in workers:
            for meth in methods:
                w = route_method(meth, st, n)
                rows.append({"stream": st.name, "workers": n, "method": meth,
                             "avg_imb": pb.avg_fraction_imbalance(w, n, n_points),
                             "final_imb": pb.final_imbalance(w, n)[1],
                             "replication": pb.replication(st.ids, w, st.n_keys, n)})
                if bar is not None:
                    bar.update(1)
    return pd.DataFrame(rows)


def plot_exp2(df: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams = list(dict.fromkeys(df["stream"]))
    fig, axes = plt.subplots(1, len(streams), figsize=(3.6 * len(streams), 3.4), squeeze=False)
    for j, st in enumerate(streams):
        d = df[df["stream"] == st]
        for meth in dict.fromkeys(d["method"]):
            s = d[d["method"] == meth].sort_values("workers")
            axes[0, j].plot(s["workers"], np.maximum(s["avg_imb"], 1e-10), marker="o", ms=3,
                            label=meth)
        axes[0, j].set(xscale="log", yscale="log", title=st, xlabel="workers W")
    axes[0, 0].set_ylabel("fraction of average imbalance")
    axes[0, -1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def experiment2(args: argparse.Namespace) -> str:
    m = 100_000 if args.quick else 1_000_000
    n_keys = 100_000
    words = words_stream(args.words, limit=m if args.quick else None)
    z_wp = zipf_skew_for_p1(PAPER_P1["WP"], n_keys)
    z_tw = zipf_skew_for_p1(PAPER_P1["TW"], n_keys)
    streams = [words, zipf_stream(m, n_keys, z_wp, name="zipf-WP-p1"),
               zipf_stream(m, n_keys, z_tw, name="zipf-TW-p1")]
    workers = [5, 10, 50, 100]
    bar = progress(len(streams) * len(workers) * len(EXP2_METHODS), "exp2 PKG Table 2")
    df = exp2_table(streams, workers, bar=bar)
    bar.close()
    out = [f"### 2. PKG Table 2: fraction of average imbalance\n\n{run_header(args, '2')}\n",
           "Metric: mean over 200 evenly spaced instants t of `I(t) / t`, "
           "`I(t) = max_w L_w(t) - mean_w L_w(t)` (message counts). PKG-G = one load "
           "vector for all messages (the global oracle; identical to one source), "
           "PKG-L*S* = *S* sources fed round-robin, each with its own local counts. "
           "PoTC = power of two choices *without* key splitting (a key's first message "
           "fixes it). Streams:\n"]
    for st in streams:
        out.append(f"- `{st.name}`: {st.label}, p1 = {st.p1:.2%}")
    out.append("")
    for st in streams:
        d = df[df["stream"] == st.name]
        p = d.pivot(index="workers", columns="method", values="avg_imb")[EXP2_METHODS]
        rows = [[f"{n}"] + [float(v) for v in p.loc[n]] for n in p.index]
        out.append(f"**Ours, `{st.name}` (p1 = {st.p1:.2%}):**\n\n"
                   f"{md_table(['W'] + EXP2_METHODS, rows)}\n")
    for ds in ("WP", "TW"):
        rows = [[f"{n}"] + v for n, v in PKG_TABLE2[ds].items()]
        out.append(f"**Paper, Table 2, {ds} (p1 = {PAPER_P1[ds]:.2%}; PKG = global):**\n\n"
                   f"{md_table(['W'] + PKG_TABLE2_COLS, rows)}\n")
    p = df.pivot_table(index=["stream", "workers"], columns="method", values="final_imb",
                       sort=False)[EXP2_METHODS]
    rows = [[f"{s}", f"{n}"] + [float(v) for v in p.loc[(s, n)]] for s, n in p.index]
    out.append("**Ours, end-of-stream `I(m) / m` only** (no averaging over time; closer to "
               "how small the paper's best cells are, see the notes):\n\n"
               f"{md_table(['stream', 'W'] + EXP2_METHODS, rows)}\n")
    cols = ["Hashing", "PKG-G", "PKG-L5", "PKG-L10"]
    p = df.pivot_table(index=["stream", "workers"], columns="method", values="replication",
                       sort=False)[cols]
    rows = [[f"{s}", f"{n}"] + [float(v) for v in p.loc[(s, n)]] for s, n in p.index]
    out.append("**Ours, replication (memory cost) of the key-splitting rows:**\n\n"
               f"{md_table(['stream', 'W'] + cols, rows)}\n")
    if args.out:
        img = args.out / "img"
        img.mkdir(parents=True, exist_ok=True)
        plot_exp2(df, img / "pkg_table2.png")
        out.append("![fraction of average imbalance vs workers](img/pkg_table2.png)\n")
    text = "\n".join(out)
    print(text)
    return text


# --------------------------------------------------------------------------
# Experiment 3: CG Fig 8 / Fig 12 (simulator)
# --------------------------------------------------------------------------

HETERO_CAPS = [5.0, 5.0, 5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]  # y = 3 of n = 10 are z = 5x
CG_SLOT_S = 0.1


def hetero_changes(t1: float, t2: float) -> list[dict]:
    """Fig 12: the fast role moves 0-2 -> 3-5 at ``t1``, then 3-5 -> 6-8 at ``t2`` (sum kept)."""
    ch = []
    for at, slow, fast in ((t1, (0, 1, 2), (3, 4, 5)), (t2, (3, 4, 5), (6, 7, 8))):
        ch += [{"at_s": round(at, 3), "worker": w, "capacity": 1.0} for w in slow]
        ch += [{"at_s": round(at, 3), "worker": w, "capacity": 5.0} for w in fast]
    return ch


def hetero_topology(scheme: str, words: Path, messages: int, *, params: dict | None = None,
                    changes: list[dict] | None = None, service_us: float = 1000.0,
                    load: float = 0.8, sources: int = 2, batch: int = 500,
                    max_inflight: int = 1_000_000) -> dict:
    """The CG paper's heterogeneous cluster as a simulator topology (``throttle: service``).

    The offered rate is ``load`` x the cluster's full-speed rate; ``max_inflight``
    is effectively unbounded so that, as in the paper's queueing model, an
    overloaded worker's queue grows instead of back-pressuring the sources.
    """
    rate = load * sum(HETERO_CAPS) * 1e6 / service_us
    return {
        "name": f"cg-hetero-{scheme}",
        "input": {"format": "parquet", "path": str(words), "key": "key", "limit": messages},
        "sources": sources,
        "workers": {"count": len(HETERO_CAPS), "capacity": HETERO_CAPS,
                    "service_us": service_us, "throttle": "service",
                    "changes": changes or []},
        "grouping": {"scheme": scheme, **(params or {})},
        "app": {"kind": "wordcount"},
        "run": {"batch": batch, "rate": rate, "max_inflight": max_inflight, "seed": SEED,
                "slot_s": 0.5},
    }


def _spread(ts: pd.DataFrame, prefix: str) -> np.ndarray:
    cols = [c for c in ts.columns if c.startswith(prefix)]
    v = ts[cols].to_numpy(dtype=np.float64)
    return v.max(axis=1) - v.min(axis=1)


def run_sim(topo: dict, sim_input=None):
    from runtime.sim import simulate

    return simulate(topo, sim_input=sim_input)


def sim_row(label: str, res) -> dict:
    rep, ts = res.report, res.timeseries
    return {"scheme": label, "duration_s": rep["duration_s"],
            "throughput": rep["throughput_msgs_per_s"],
            "lat_mean_ms": rep["latency_ms"]["mean"], "lat_p99_ms": rep["latency_ms"]["p99"],
            "queue_spread": float(np.mean(_spread(ts, "queue_w"))),
            "util_spread": float(np.mean(_spread(ts, "util_w"))),
            "imbalance": rep["imbalance"]["mean"], "migrations": rep["migrations"],
            "replication": rep["replication"]}


SIM_COLS = ["scheme", "duration_s", "throughput", "lat_mean_ms", "lat_p99_ms", "queue_spread",
            "util_spread", "imbalance", "migrations", "replication"]


def plot_exp3(runs: dict[str, dict[str, pd.DataFrame]], changes_at: Sequence[float],
              path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = list(runs)
    fig, axes = plt.subplots(4, len(figs), figsize=(5.2 * len(figs), 10), squeeze=False,
                             sharex="col")
    for j, figname in enumerate(figs):
        for label, ts in runs[figname].items():
            t = ts["t_s"]
            axes[0, j].plot(t, _spread(ts, "queue_w"), label=label)
            axes[1, j].plot(t, ts["latency_p50_ms"].clip(lower=1e-3), label=f"{label} p50")
            axes[2, j].plot(t, _spread(ts, "util_w"), label=label)
            vw = [c for c in ts.columns if c.startswith("vw_w")]
            if vw and ts[vw].notna().any().any() and label.startswith("CG"):
                cap = ts[[c.replace("vw_", "capacity_") for c in vw]].to_numpy()
                share = ts[vw].to_numpy() / ts[vw].to_numpy().sum(axis=1, keepdims=True)
                want = cap / cap.sum(axis=1, keepdims=True)
                axes[3, j].plot(t, np.abs(share - want).sum(axis=1) / 2, label=label)
        axes[0, j].set(title=figname, ylabel="max - min queue (msgs)", yscale="symlog")
        axes[1, j].set(ylabel="p50 latency (ms)", yscale="log")
        axes[2, j].set(ylabel="max - min utilization", yscale="symlog")
        axes[3, j].set(ylabel="CG: VW share off capacity share", xlabel="simulated time (s)")
        if j == len(figs) - 1:
            for at in changes_at:
                for a in axes[:, j]:
                    a.axvline(at, color="grey", lw=0.8, ls="--")
        for a in axes[:, j]:
            a.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def experiment3(args: argparse.Namespace) -> str:
    from runtime.sim.inputs import load_input
    from runtime.topology import load_topology

    messages = 150_000 if args.quick else 1_000_000
    service_us = 1000.0
    rate = 0.8 * sum(HETERO_CAPS) * 1e6 / service_us
    horizon = messages / rate
    t1, t2 = horizon / 3, 2 * horizon / 3
    # the paper does not give its signal slot t0; 0.1 s lets every worker signal each
    # source on about every other ack (each source sends ~17 batches/s)
    cg10 = {"virtual_per_worker": 10, "eps": 0.01, "slot_s": CG_SLOT_S}
    cg100 = {"virtual_per_worker": 100, "eps": 0.01, "slot_s": CG_SLOT_S}
    setups = {
        "Fig 8 (static capacities)": ([], [("KG", "kg", {}), ("SG", "sg", {}),
                                           ("CG R=10", "cg", cg10)]),
        "Fig 12 (capacities change twice)": (
            hetero_changes(t1, t2),
            [("KG", "kg", {}), ("SG", "sg", {}), ("CG R=10", "cg", cg10),
             ("CG R=100", "cg", cg100)]),
    }
    inp = load_input(load_topology(hetero_topology("kg", args.words, messages)))
    bar = progress(sum(len(v[1]) for v in setups.values()), "exp3 CG Fig 8/12 (sim)")
    signals = SCHEMES["cg"].worker_signals(cg10)  # what CG's workers were told
    tables, series = {}, {}
    for figname, (changes, schemes) in setups.items():
        rows, series[figname] = [], {}
        for label, scheme, params in schemes:
            topo = hetero_topology(scheme, args.words, messages, params=params,
                                   changes=changes, service_us=service_us)
            res = run_sim(topo, sim_input=inp)
            rows.append(sim_row(label, res))
            series[figname][label] = res.timeseries
            bar.update(1)
        tables[figname] = pd.DataFrame(rows)[SIM_COLS]
    bar.close()
    out = [f"### 3. CG Fig 8 / Fig 12: heterogeneous cluster in the simulator\n\n"
           f"{run_header(args, '3')}\n",
           f"Setup: `runtime.sim` (the runtime's cores on a virtual clock), word stream ({messages:,} messages of "
           f"`{args.words.name}`), 2 sources, n = 10 workers with capacities "
           f"{[int(c) for c in HETERO_CAPS]} (`throttle: service`, `service_us` = "
           f"{service_us:g}, so full speed = {sum(HETERO_CAPS) * 1e6 / service_us:,.0f} msgs/s), "
           f"offered rate 80% of it ({rate:,.0f} msgs/s, ~{horizon:.0f} s of input), micro-batches "
           "of 500, in-flight window unbounded (queues grow as in the paper's model instead of "
           "back-pressuring the sources), CG eps = 0.01, R virtual workers per worker, busy above "
           f"{signals.busy_above:g} / idle below {signals.idle_below:g} (queue-length "
           f"utilization), signal slot {signals.slot_s:g} s "
           f"(time-series slot 0.5 s). Fig 12: at t = {t1:.1f} s workers 0-2 drop "
           f"to 1 and 3-5 rise to 5; at t = {t2:.1f} s 3-5 drop to 1 and 6-8 rise to 5 (total "
           "22 throughout). `queue_spread` / `util_spread`: mean over slots of max - min across "
           "workers (the paper's y-axes); `imbalance`: mean of I(t) = max U - mean U; "
           "latency over every message.\n"]
    for figname, df in tables.items():
        rows = [[r["scheme"]] + [float(r[c]) for c in SIM_COLS[1:]] for _, r in df.iterrows()]
        out.append(f"**Ours, {figname}:**\n\n{md_table(SIM_COLS, rows)}\n")
    if args.out:
        img = args.out / "img"
        img.mkdir(parents=True, exist_ok=True)
        plot_exp3(series, [t1, t2], img / "cg_fig8_fig12.png")
        out.append("![CG Fig 8 / Fig 12 reproduction](img/cg_fig8_fig12.png)\n")
    text = "\n".join(out)
    print(text)
    return text


# --------------------------------------------------------------------------
# Experiment 4: FISH execution time and memory (simulator)
# --------------------------------------------------------------------------

EXP4_SCHEMES = ["sg", "kg", "pkg", "dchoices", "wchoices", "fish"]
EXP4_LABEL = {"sg": "SG", "kg": "KG", "pkg": "PKG", "dchoices": "D-C", "wchoices": "W-C",
              "fish": "FISH"}


def fish_topology(scheme: str, inp: dict, n_workers: int, *, sources: int = 4,
                  batch: int = 1000) -> dict:
    """Homogeneous workers, sources as fast as backpressure allows: duration = makespan."""
    return {
        "name": f"fish-{scheme}-{n_workers}",
        "input": inp,
        "sources": sources,
        "workers": {"count": n_workers, "capacity": 1.0, "service_us": 100.0,
                    "throttle": "service"},
        "grouping": {"scheme": scheme},
        "app": {"kind": "wordcount"},
        "run": {"batch": batch, "rate": 0, "seed": SEED, "slot_s": 0.5},
    }


def plot_exp4(df: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams = list(dict.fromkeys(df["stream"]))
    fig, axes = plt.subplots(2, len(streams), figsize=(4.2 * len(streams), 6.4), squeeze=False)
    for j, st in enumerate(streams):
        d = df[df["stream"] == st]
        for sch in dict.fromkeys(d["scheme"]):
            s = d[d["scheme"] == sch].sort_values("workers")
            axes[0, j].plot(s["workers"], s["time_vs_sg"], marker="o", ms=3, label=sch)
            axes[1, j].plot(s["workers"], s["memory_vs_kg"], marker="o", ms=3, label=sch)
        axes[0, j].set(xscale="log", title=st, ylabel="execution time / SG")
        axes[1, j].set(xscale="log", yscale="log", xlabel="workers", ylabel="replication / KG")
        for a in axes[:, j]:
            a.set_xticks(sorted(d["workers"].unique()))
            a.set_xticklabels([str(x) for x in sorted(d["workers"].unique())])
    axes[0, -1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def experiment4(args: argparse.Namespace) -> str:
    from runtime.sim.inputs import load_input
    from runtime.topology import load_topology

    messages = 100_000 if args.quick else 1_000_000
    workers = [16, 128] if args.quick else [16, 32, 64, 128]
    schemes = [s for s in EXP4_SCHEMES if s in SCHEMES]
    missing = [s for s in EXP4_SCHEMES if s not in SCHEMES]
    inputs = {
        "evolving-zipf": {"format": "evolving-zipf", "messages": messages, "keys": 100_000,
                          "skew": 1.0, "seed": SEED, "shift_every": messages // 4},
        "words": {"format": "parquet", "path": str(args.words), "key": "key",
                  "limit": messages},
    }
    bar = progress(len(inputs) * len(workers) * len(schemes), "exp4 FISH (sim)")
    rows = []
    for stream, spec in inputs.items():
        inp = load_input(load_topology(fish_topology("kg", spec, workers[0])))
        for n in workers:
            for scheme in schemes:
                res = run_sim(fish_topology(scheme, spec, n), sim_input=inp)
                rep = res.report
                rows.append({"stream": stream, "workers": n, "scheme": EXP4_LABEL[scheme],
                             "duration_s": rep["duration_s"],
                             "lat_p99_ms": rep["latency_ms"]["p99"],
                             "replication": rep["replication"]})
                bar.update(1)
    bar.close()
    df = pd.DataFrame(rows)
    base = df.set_index(["stream", "workers", "scheme"])
    df["time_vs_sg"] = [r.duration_s / base.loc[(r.stream, r.workers, "SG"), "duration_s"]
                        for r in df.itertuples()]
    df["memory_vs_kg"] = [r.replication / base.loc[(r.stream, r.workers, "KG"), "replication"]
                          for r in df.itertuples()]
    out = [f"### 4. FISH: execution time vs SG and memory vs KG (simulator)\n\n"
           f"{run_header(args, '4')}\n",
           f"Setup: `runtime.sim`, 4 sources, homogeneous workers (`service_us` = 100), sources "
           "as fast as backpressure allows (`run.rate: 0`, 2 in-flight micro-batches of 1,000 "
           "per worker), so the simulated duration is the makespan set by the most loaded "
           f"worker. Streams: `evolving-zipf` ({messages:,} messages, 100,000 keys, z = 1.0, "
           f"hot keys reshuffled every {messages // 4:,} messages) and the word stream (first "
           f"{messages:,} messages of `{args.words.name}`). Execution time = simulated "
           "duration / SG's; memory = replication / KG's (= replication, KG's is 1).\n"]
    if missing:
        out.append(f"Schemes not yet in the registry (skipped): {', '.join(missing)}.\n")
    labels = [EXP4_LABEL[s] for s in schemes]
    for value, title in (("time_vs_sg", "execution time relative to SG"),
                         ("memory_vs_kg", "memory (replication) relative to KG")):
        p = df.pivot_table(index=["stream", "workers"], columns="scheme", values=value,
                           sort=False)[labels]
        rows_md = [[s, f"{n}"] + [float(v) for v in p.loc[(s, n)]] for s, n in p.index]
        out.append(f"**Ours, {title}:**\n\n{md_table(['stream', 'workers'] + labels, rows_md)}\n")
    p = df.pivot_table(index=["stream", "workers"], columns="scheme", values="lat_p99_ms",
                       sort=False)[labels]
    rows_md = [[s, f"{n}"] + [float(v) for v in p.loc[(s, n)]] for s, n in p.index]
    out.append("**Ours, p99 latency (ms; with backpressure, queueing is bounded by the in-flight "
               f"window):**\n\n{md_table(['stream', 'workers'] + labels, rows_md)}\n")
    if args.out:
        img = args.out / "img"
        img.mkdir(parents=True, exist_ok=True)
        plot_exp4(df, img / "fish_time_memory.png")
        out.append("![FISH reproduction: execution time and memory](img/fish_time_memory.png)\n")
    text = "\n".join(out)
    print(text)
    return text


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

EXPERIMENTS: dict[str, Callable[[argparse.Namespace], str]] = {
    "1": experiment1, "2": experiment2, "3": experiment3, "4": experiment4,
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(EXPERIMENTS),
                    help="comma-separated experiments to run (default: all)")
    ap.add_argument("--quick", action="store_true", help="small streams: a ~1 minute smoke run")
    ap.add_argument("--out", type=Path, default=None,
                    help="docs directory: rewrite DIR/reproduction.md blocks and DIR/img/*.png")
    ap.add_argument("--words", type=Path, default=DEFAULT_WORDS,
                    help="word stream parquet (columns ts, key); default: the bundled 1M sample")
    args = ap.parse_args(argv)
    args.only = [e.strip() for e in args.only.split(",") if e.strip()]
    bad = [e for e in args.only if e not in EXPERIMENTS]
    if bad:
        ap.error(f"--only: unknown experiment(s) {bad} (known: {', '.join(EXPERIMENTS)})")
    if not args.words.exists():
        ap.error(f"--words: {args.words} does not exist")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for exp in args.only:
        t0 = time.perf_counter()
        text = EXPERIMENTS[exp](args)
        print(f"[experiment {exp}: {time.perf_counter() - t0:.1f} s]", file=sys.stderr)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            write_block(args.out, f"exp{exp}", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
