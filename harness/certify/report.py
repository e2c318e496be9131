"""What `attnlip certify` writes and prints: table.csv, summary.md and radii.png (certified radius beside the
attack's adversarial radius per input). Reads the rows of harness.certify.run only."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import pandas as pd

from harness.store.atomic import staged_files


def frame(rows: List[Dict[str, object]]) -> pd.DataFrame:
    return pd.DataFrame(rows)


def stats(df: pd.DataFrame) -> Dict[str, float]:
    """Accuracy, certified accuracy (correct with radius > 0), median radii over correct inputs, violations."""
    ok = df[df["correct"].astype(bool)]
    att = pd.to_numeric(ok["attack_radius"], errors="coerce")
    ratio = ok["certified_radius"] / att
    return dict(inputs=len(df), accuracy=float(df["correct"].mean()) if len(df) else math.nan,
                median_certified_radius=float(ok["certified_radius"].median()) if len(ok) else math.nan,
                median_attack_radius=float(att[np.isfinite(att)].median()) if np.isfinite(att).any() else math.nan,
                median_certified_over_attack=float(ratio[np.isfinite(ratio)].median())
                if np.isfinite(ratio).any() else math.nan,
                violations=int((~df["sound"].astype(bool)).sum()),
                median_seconds=float(df["seconds"].median()) if len(df) else math.nan)


def compact(df: pd.DataFrame) -> str:
    cols = ["index", "label", "pred", "certified_radius", "attack_radius", "route", "seconds", "input"]
    show = df[[c for c in cols if c in df]].copy()
    for c in ("certified_radius", "attack_radius"):
        show[c] = show[c].map(lambda v: f"{v:.4g}")
    show["seconds"] = show["seconds"].map(lambda v: f"{v:.1f}")
    return show.to_string(index=False)


def figure(df: pd.DataFrame, path: Path, title: str) -> Optional[Path]:
    """Per correct input, sorted by certified radius: the certified radius and the attack's radius (log scale)."""
    from harness import plotting

    ok = df[df["correct"].astype(bool) & (df["certified_radius"] > 0)].sort_values("certified_radius")
    if ok.empty:
        return None
    fig, ax = plotting.figure(width=7.0, height=3.6)
    x = np.arange(len(ok))
    ax.plot(x, ok["certified_radius"], "o", color=plotting.color("best"), label="certified radius (ours)")
    att = pd.to_numeric(ok["attack_radius"], errors="coerce").to_numpy(dtype=float)
    if np.isfinite(att).any():
        ax.plot(x, att, "v", color=plotting.color("pgd"), label="smallest adversarial radius (PGD)")
        for xi, lo, hi in zip(x, ok["certified_radius"], att):
            if np.isfinite(hi):
                ax.plot([xi, xi], [lo, hi], color="0.7", lw=0.8, zorder=0)
    ax.set_yscale("log")
    ax.set_xlabel("correctly classified input (sorted by certified radius)")
    ax.set_ylabel("l2 radius")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    out = plotting.save(fig, path.parent, path.stem, formats=("png",))
    return out[0] if out else None


def summary(df: pd.DataFrame, meta: Dict[str, object]) -> str:
    s = stats(df)
    lines = [f"# attnlip certify: {meta.get('model', '')}", "",
             f"- perturbation: {meta.get('perturbation', '')}",
             f"- inputs: {s['inputs']}, accuracy {s['accuracy']:.3f}, certificate violations (certified radius above "
             f"the attack's): {s['violations']}",
             f"- median certified l2 radius (correct inputs): {s['median_certified_radius']:.4g}; median smallest "
             f"adversarial radius found by PGD: {s['median_attack_radius']:.4g}; median certified / attack: "
             f"{s['median_certified_over_attack']:.3g}",
             f"- median seconds per input (certificate): {s['median_seconds']:.2f}",
             f"- guarantee: each certificate holds with probability >= 1 - fail_prob over Lanczos starts hashed from "
             f"the model and input (largest fail_prob: {float(df['fail_prob'].max()) if len(df) else 0:.1e}); "
             "every other step is deterministic",
             "- routes: 'layer by layer' propagates each block's certified ball change (or, with one word moving, "
             "the exact prefix Jacobian's radius where smaller); 'network' bounds every margin by its exact "
             "gradient and a certified bound on the gradient's variation over the ball (docs/math.md §6)", "",
             "| # | label | pred | certified radius | attack radius | route | attention certificates | s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        lines.append(f"| {r.index} | {r.label} | {r.pred} | {r.certified_radius:.4g} | {r.attack_radius:.4g} | "
                     f"{r.route} | {r.attention_certificates} | {r.seconds:.1f} |")
    return "\n".join(lines) + "\n"


def write(df: pd.DataFrame, out: Path, meta: Dict[str, object]) -> List[Path]:
    """table.csv, summary.md and radii.png (when there is a radius to plot) in `out`, written into a temp folder
    and then moved into place (store.atomic.staged_files): a failed write leaves what `out` held, complete."""
    with staged_files(out) as stage:
        df.to_csv(stage / "table.csv", index=False)
        (stage / "summary.md").write_text(summary(df, meta), encoding="utf-8")
        fig = figure(df, stage / "radii.png", f"certified vs adversarial l2 radius: {meta.get('model', '')}")
    return [out / "table.csv", out / "summary.md"] + ([out / fig.name] if fig else [])
