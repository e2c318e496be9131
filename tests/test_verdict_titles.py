"""Figure titles and the results README carry the verdict the summary decides from the table: a title never says
'Reproduces' for a result that did not reproduce."""
from pathlib import Path

import pandas as pd

from harness import plotting, report
from harness.run import outputs


def test_verdict_label_reads_each_verdict_of_a_summary():
    text = ("numbers\n\nVerdict (Fig. 4: a claim; scope: head): **not reproduced**: because.\n"
            "Verdict (Prop. 1): **reproduced** on 2 models.\nVerdict (again): **reproduced**.")
    assert report.verdict_label(text) == "not reproduced / reproduced"
    assert report.verdict_label("no verdict, **bold** text") == ""


def test_headline_carries_the_verdict_and_never_claims_one():
    assert plotting.headline("Castin et al. 2024, Fig. 1", "not reproduced") == \
        "Castin et al. 2024, Fig. 1: verdict not reproduced"
    assert plotting.headline("Reproduces JaSMin Fig. 4", "partly reproduced") == \
        "JaSMin Fig. 4: verdict partly reproduced"
    assert plotting.headline("JaSMin Fig. 4", "") == "Checks JaSMin Fig. 4"
    assert plotting.headline("Measures the cost", "") == "Measures the cost"
    with plotting.verdict("partly reproduced"):
        assert plotting.headline("LoFAST Fig. 2").endswith("verdict partly reproduced")
    assert plotting.VERDICT["label"] == ""


class _Exp:
    """An experiment whose summary decides 'not reproduced' and whose figure records its title."""

    titles = []

    def summary(self, table):
        return f"Verdict (claim): **{'not reproduced' if table['x'].max() < 1 else 'reproduced'}**: x."

    def figures(self, table, outdir):
        fig, ax = plotting.figure()
        ax.plot(table["x"])
        paths = plotting.finish(fig, outdir, "fake", "Reproduces Paper Fig. 9", title="x")
        self.titles.append(fig._suptitle.get_text())
        return paths


def test_rendered_titles_say_the_summary_s_verdict(tmp_path: Path):
    exp = _Exp()
    outputs.render_figures(exp, pd.DataFrame({"x": [0.1, 0.5]}), tmp_path)
    assert exp.titles[-1] == "x\nPaper Fig. 9: verdict not reproduced"
    outputs.render_figures(exp, pd.DataFrame({"x": [2.0, 3.0]}), tmp_path)
    assert exp.titles[-1] == "x\nPaper Fig. 9: verdict reproduced"
    assert not any("Reproduces" in t for t in exp.titles)
