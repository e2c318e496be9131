"""The Castin experiments' paper models and their stand-ins.

Castin et al. measure pretrained BERT-base ("bert-base-uncased", as encoder and decoder) and GPT-2 (pretrained and
randomly initialized). A cell naming one of them with pretrained "auto" runs the hub weights where they are cached
or can be downloaded, and otherwise the same architecture from seeded random init under the same name
(harness.run.substitutes; the model source in the cell key says which ran). MiniLM panels are pretrained
measurements of their own, not substitutes.

Only the experiments' declarations read this module (their run() does not), so it is not part of any cell key.
"""
from __future__ import annotations

from harness.catalog import Substitute

PAPER_MODELS = ("bert-base-uncased", "gpt2")
PRETRAINED = tuple(Substitute("model", m, None, label=f"pretrained {m}", use_label=f"random-init {m}")
                   for m in PAPER_MODELS)
