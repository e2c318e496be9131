"""House style helpers: save() writes PNG + PDF, slope fit, footnotes, family colors."""
import numpy as np

from harness import plotting


def test_save_png_pdf_and_helpers(tmp_path):
    fig, ax = plotting.figure(1, 2)
    x = np.array([1.0, 2, 4, 8])
    plotting.loglog(ax[0], x, 3 * x ** 0.5, label="bound_castin")
    plotting.slope_guide(ax[0], x, 0.5, (1, 3))
    plotting.semilogy(ax[1], x, np.exp(x), key="exact")
    plotting.caption(ax[1], "(b)")
    plotting.substitute_note(fig, "BERT-base", "MiniLM-L6")
    paths = plotting.save(fig, tmp_path / "figs", "demo")
    assert [p.name for p in paths] == ["demo.png", "demo.pdf"] and all(p.stat().st_size > 0 for p in paths)
    assert abs(plotting.fit_slope(x, 3 * x ** 0.5) - 0.5) < 1e-12
    assert plotting.color("bound_castin") == plotting.COLORS["castin"]
