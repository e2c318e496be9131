"""What the LoFAST bound studies read from outside the repository (harness.models.lofast_eval.study_layer), for
their Experiment.data_names / model_source: source "vit" is the ViT trained here on the cell's `dataset`; source
"minilm" is MiniLM (pretrained when its weights are there) on SST-2 token windows, whatever the cell's `dataset`
(the ViT keys are in every cell of these grids)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from harness.catalog import Experiment

MINILM_DATA = "sst2"  # the corpus lofast_eval.minilm_layer draws its windows from


def data_names(cell: Dict[str, Any]) -> List[str]:
    return [MINILM_DATA] if cell["source"] == "minilm" else [cell["dataset"]]


def model_source(cell: Dict[str, Any]) -> Optional[str]:
    if cell["source"] != "minilm":
        return None  # the ViT trained here: its training budget is in the cell
    from harness.models import text

    return text.model_source("minilm")


class StudyExperiment(Experiment):
    """Base of the LoFAST bound studies: their datasets and weights, as the functions above say."""

    def data_names(self, cell: Dict[str, Any]) -> List[str]:
        return data_names(cell)  # SST-2 for the MiniLM cells, the ViT's images otherwise: part of the key

    def model_source(self, cell: Dict[str, Any]) -> Optional[str]:
        return model_source(cell)

    def study_layer(self, cell: Dict[str, Any], ctx):
        """(weights, inputs X (samples, n, d), model label) of the cell's source in the run's dtype and device:
        harness.models.lofast_eval.study_layer with the run's seed, artifact store and progress bar."""
        from harness.models import lofast_eval
        from harness.store.artifacts import cached_artifact

        return lofast_eval.study_layer(cell["source"], int(cell["samples"]), cell=cell, seed=ctx.seed,
                                       store=cached_artifact, root=ctx.artifacts, dtype=ctx.torch_dtype,
                                       device=ctx.torch_device, pbar=ctx.pbar)
