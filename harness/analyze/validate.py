"""Checks of `attnlip analyze`'s options and of a model's inputs, run before anything is computed, so a user
mistake gives one message naming the option and its fix (exit status 2) instead of a traceback or a silently
different analysis (a wrapped layer index, a tokenizer that maps every word to [UNK], an ignored --max-tokens).

Option checks (`check_options`) need only the parsed arguments; model checks (`resolve_layers`, `token_budget`,
`check_tokenizer`) run in core.analyze after the model is loaded and before its forward pass, so the Python API
gets them too.
"""
from __future__ import annotations

import math
import operator
import unicodedata
from typing import TYPE_CHECKING, Iterable, List, Optional, Sequence

from harness.settings import ANALYZE_EPS, ANALYZE_PGD_STEPS

if TYPE_CHECKING:  # torch loads where a check needs it: --help and the option checks answer without it
    import torch


DEFAULT_MAX_TOKENS = 128  # the CLI's --max-tokens when not given (capped at the model's positions)
MIN_VOCAB_SHARE = 0.5  # a tokenizer knowing fewer tokens than this share of the embedding rows is not the model's
MAX_UNK_SHARE = 0.5  # refuse inputs whose real tokens are at least this share unknown ([UNK])


class UsageError(ValueError):
    """A user mistake, found before computing. `option`: the command-line option (or Python argument) at fault;
    `fix`: what to pass instead. str(): "OPTION: PROBLEM. Fix: FIX"."""

    def __init__(self, option: str, problem: str, fix: str):
        self.option, self.problem, self.fix = option, problem, fix
        super().__init__(f"{option}: {problem}. Fix: {fix}")


# ---- options alone ----------------------------------------------------------------------------------------------
def parse_layers(spec: str) -> List[int]:
    """--layers "0,5,-1" -> [0, 5, -1] (empty items skipped); a non-integer item or no item is a UsageError."""
    out = []
    for item in (x.strip() for x in str(spec).split(",")):
        if not item:
            continue
        try:
            out.append(int(item))
        except ValueError:
            raise UsageError("--layers", f"{item!r} is not a layer index",
                             "give comma-separated integers such as --layers 0,5 (-1 = the last layer)") from None
    if not out:
        raise UsageError("--layers", f"{spec!r} names no layer",
                         "give comma-separated integers such as --layers 0,5, or leave --layers out for all layers")
    return out


# The largest --eps: token norms are O(1..100), so a larger ball is no longer a perturbation, and its squared
# radius drives the attention scores of a float32 forward pass (and the bounds' products) toward overflow, where
# a bound would read inf and PGD 0.
MAX_EPS = 1e6


def check_numbers(eps: float, pgd_steps: int, samples: Optional[int] = None, max_tokens: Optional[int] = None
                  ) -> None:
    """Ranges of the numeric options: 0 <= eps <= MAX_EPS, pgd_steps >= 0 (AnalyzeOptions, once), samples >= 1,
    max_tokens >= 2 (check_counts)."""
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and 0 <= eps <= MAX_EPS):
        raise UsageError("--eps", f"the radius must be a number in [0, {MAX_EPS:g}], got {eps}",
                         f"pass --eps {ANALYZE_EPS:g} (the default), or --eps 0 to skip Theorem 1's delta and PGD")
    if pgd_steps < 0:
        raise UsageError("--pgd-steps", f"the number of PGD steps must be >= 0, got {pgd_steps}",
                         f"pass --pgd-steps {ANALYZE_PGD_STEPS} (the default), or --pgd-steps 0 to skip PGD")
    check_counts(samples, max_tokens)


def check_counts(samples: Optional[int] = None, max_tokens: Optional[int] = None) -> None:
    """samples >= 1 and max_tokens >= 2 (None: not given)."""
    if samples is not None and samples < 1:
        raise UsageError("--samples", f"the number of inputs to analyze must be >= 1, got {samples}",
                         "pass --samples K with K >= 1, or leave it out to analyze every text given")
    if max_tokens is not None and max_tokens < 2:
        raise UsageError("--max-tokens", f"texts cannot be truncated to {max_tokens} token(s): attention needs "
                                         "at least 2", "pass --max-tokens N with N >= 2 (default 128)")


def check_device(device) -> torch.device:
    """torch.device(device) if this machine can run on it; a UsageError naming --device otherwise."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise UsageError("--device", f"{device!r} is not a device name", "pass --device cpu, cuda, cuda:N or mps") \
            from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device", f"{device!r} is not available: this torch {torch.__version__} sees no "
                                         "CUDA device", "pass --device cpu, or run on a machine with an NVIDIA GPU "
                                                        "and a CUDA build of torch")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise UsageError("--device", f"{device!r} is not available: this machine has {count} CUDA device(s)",
                             f"pass --device cuda:0 .. cuda:{count - 1}")
        return dev
    backend = getattr(torch.backends, dev.type, None) if dev.type == "mps" else getattr(torch, dev.type, None)
    available = getattr(backend, "is_available", None)
    if available is None or not available():
        raise UsageError("--device", f"{device!r} is not available on this machine",
                         "pass --device cpu" + (" or cuda" if torch.cuda.is_available() else ""))
    return dev


# Unicode categories that show nothing: separators (spaces, line and paragraph separators), control characters and
# format characters (zero-width spaces and joiners, bidirectional marks and overrides, the byte-order mark).
INVISIBLE = ("Zs", "Zl", "Zp", "Cc", "Cf")


def check_texts(texts: Sequence[str], option: str, where: str = "") -> None:
    """Every text holds a visible character (an empty text, or one of spaces, zero-width or bidirectional marks
    only, would analyze the tokenizer's special tokens alone)."""
    if not texts:
        raise UsageError(option, f"{where or 'the input'} holds no text",
                         "give at least one non-empty text" + (" (one per line)" if option == "--text-file" else ""))
    for i, t in enumerate(texts):
        t = str(t)
        if not any(unicodedata.category(c) not in INVISIBLE for c in t):
            shown = " ".join(f"U+{ord(c):04X}" for c in t[:8] if not c.isspace()) + (" ..." if len(t) > 8 else "")
            raise UsageError(option, f"text {i + 1} is empty" + (f" (invisible characters only: {shown})"
                                                                   if shown else ""), "give non-empty texts")


def real_tokens(input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor], tokenizer) -> torch.Tensor:
    """Bool mask of the text's own tokens: not padding, not one of the tokenizer's special tokens ([UNK] counts as
    the text's)."""
    import torch

    real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    unk = getattr(tokenizer, "unk_token_id", None)
    specials = [i for i in getattr(tokenizer, "all_special_ids", []) if i != unk]
    if specials and input_ids.numel():
        real = real & ~torch.isin(input_ids, torch.tensor(specials, dtype=input_ids.dtype))
    return real


def check_real_tokens(input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor], tokenizer) -> None:
    """Every text keeps a token of its own beside the tokenizer's special tokens (a tokenizer drops characters it
    cannot read: a text of those alone would analyze [CLS] [SEP] only)."""
    if input_ids.dim() != 2:
        return
    empty = [i + 1 for i, k in enumerate(real_tokens(input_ids, attention_mask, tokenizer).sum(-1).tolist()) if not k]
    if empty:
        which = f"text {empty[0]} holds" if len(empty) == 1 else f"texts {', '.join(map(str, empty[:5]))} hold"
        raise UsageError("inputs", f"{which} no token beside the tokenizer's special tokens (it drops every "
                                   "character in them)", "give texts with words in them")


def check_options(a) -> None:
    """Every check that needs only the parsed command line (argparse namespace of harness.analyze.cli)."""
    check_counts(a.samples, a.max_tokens)  # eps and pgd_steps: AnalyzeOptions, built from the same arguments
    check_device(a.device)
    if a.text is not None:
        check_texts(a.text, "--text")


# ---- the loaded model -------------------------------------------------------------------------------------------
def resolve_layers(layers: Optional[Iterable[int]], n_layers: int) -> List[int]:
    """Layer indices in 0..L-1 (all when None); negative indices count from the last layer (-1 = L-1), as in
    Python. An index outside -L..L-1 is a UsageError, never wrapped. Duplicates are dropped, order kept."""
    L = int(n_layers)
    if layers is None:
        return list(range(L))
    out = []
    for raw in layers:
        try:
            l = operator.index(raw)
        except TypeError:
            raise UsageError("--layers", f"{raw!r} is not a layer index", "give integers") from None
        if not -L <= l < L:
            raise UsageError("--layers", f"layer {l} does not exist: the model has {L} layers, 0..{L - 1} "
                                         f"(negative indices count from the last: -1 is layer {L - 1})",
                             f"pass indices from 0 to {L - 1} (or -{L} to -1)")
        out.append(l % L)
    return list(dict.fromkeys(out))


def position_limit(model) -> Optional[int]:
    """The most tokens the model's position embeddings take (None: no such limit, e.g. relative positions or a
    ViT). RoBERTa-style embeddings start positions after padding_idx, so they take padding_idx + 1 fewer."""
    hf_config = getattr(model, "config", None)
    if hf_config is None or getattr(hf_config, "model_type", None) == "vit":
        return None
    n = getattr(hf_config, "max_position_embeddings", None)
    if not isinstance(n, int) or n <= 0:
        return None
    emb = getattr(model, "embeddings", None)
    pad = getattr(emb, "padding_idx", None)
    if isinstance(pad, int) and hasattr(emb, "position_embeddings"):
        n -= pad + 1
    return n


def token_budget(max_tokens: Optional[int], default: Optional[int], model, tokenizer=None,
                 notices: Optional[list] = None) -> Optional[int]:
    """The truncation length to tokenize with. max_tokens given: it must leave room for one real token beside the
    tokenizer's special tokens and not exceed the model's positions (UsageError otherwise: nothing is truncated
    behind the user's back). Not given: `default` (or no truncation), capped at the model's positions, with a
    notice when the cap applies."""
    limit = position_limit(model)
    special = tokenizer.num_special_tokens_to_add() if hasattr(tokenizer, "num_special_tokens_to_add") else 0
    low = max(2, special + 1)
    if limit is not None and tokenizer is not None and limit < low:  # a tokenizer cannot truncate below its specials
        raise UsageError("--model", f"the model has {limit} position(s) (config.max_position_embeddings), too few "
                                    f"for a text: attention needs {low} tokens or more with the tokenizer's "
                                    f"{special} special token(s)", "use a model with more positions")
    if max_tokens is None:
        eff = default if limit is None or default is None else min(default, limit)
        if eff is None:
            eff = limit
        if notices is not None and default is not None and limit is not None and limit < default:
            notices.append(f"--max-tokens defaults to {default}, but the model has {limit} positions: texts are "
                           f"truncated to {limit} tokens")
        return eff
    m = operator.index(max_tokens)
    if m < low:
        raise UsageError("--max-tokens", f"{m} token(s) leave no room for text beside the {special} special "
                                         "token(s) the tokenizer adds",
                         f"pass --max-tokens {low} or more (default {DEFAULT_MAX_TOKENS})")
    if limit is not None and m > limit:
        raise UsageError("--max-tokens", f"{m} exceeds the {limit} positions the model has "
                                         "(config.max_position_embeddings)", f"pass --max-tokens {limit} or less")
    return m


def truncation_notice(tokenizer, texts: Sequence[str], budget: Optional[int], limit: Optional[int],
                      notices: list) -> None:
    """A notice when texts are longer than `budget` tokens (special tokens included) and were cut: how many, the
    longest, and how to keep more (up to the model's `limit` positions). Nothing is cut silently."""
    if not budget or tokenizer is None:
        return
    lens = [len(ids) for ids in tokenizer(list(texts), add_special_tokens=True, verbose=False)["input_ids"]]
    cut = [n for n in lens if n > budget]
    if not cut:
        return
    more = (f"pass --max-tokens up to {limit} to keep more" if limit is not None and limit > budget
            else "the model has no more positions: split long texts to analyze the rest")
    notices.append(f"{len(cut)} of {len(lens)} text(s) are longer than {budget} tokens (longest {max(cut)}) and "
                   f"were truncated to {budget}: {more}")


def require_tokenizer(tokenizer) -> None:
    """Texts need a tokenizer: a UsageError naming --model and how to provide one when there is none."""
    if tokenizer is None:
        raise UsageError("--model", "the model has no tokenizer, so texts cannot be read",
                         "save the model's tokenizer next to its weights (tokenizer.save_pretrained(DIR)), or in "
                         "Python pass tokenizer=... or token ids")


SPECIAL = ("pad_token_id", "bos_token_id", "eos_token_id")


def check_tokenizer(model, tokenizer, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor],
                    notices: Optional[list] = None) -> None:
    """Refuse a tokenizer that does not belong to the model: far fewer tokens than the model's embedding rows
    (transformers builds a 5-token tokenizer for a folder without one), special-token or input ids outside the
    embedding, or inputs that are mostly [UNK]. Special ids that differ between the tokenizer and the model's
    config only give a notice (padding is masked, so they do not change the analyzed map)."""
    require_tokenizer(tokenizer)
    fix = ("save the model's own tokenizer in its folder: AutoTokenizer.from_pretrained(ORIGINAL)"
           ".save_pretrained(DIR)")
    hf_config = getattr(model, "config", None)
    V = getattr(hf_config, "vocab_size", None)
    n_tok = len(tokenizer)
    if isinstance(V, int) and V > 0:
        if n_tok < MIN_VOCAB_SHARE * V:
            raise UsageError("--model", f"the tokenizer knows {n_tok} tokens but the model embeds {V} "
                                        "(config.vocab_size): it is not this model's tokenizer", fix)
        bad = {k: getattr(tokenizer, k, None) for k in SPECIAL + ("cls_token_id", "sep_token_id", "unk_token_id")}
        bad = {k: v for k, v in bad.items() if isinstance(v, int) and not 0 <= v < V}
        if bad:
            raise UsageError("--model", f"the tokenizer's special tokens {bad} lie outside the model's {V} "
                                        "embeddings", fix)
        top = int(input_ids.max()) if input_ids.numel() else 0
        if top >= V:
            raise UsageError("--model", f"the tokenizer produced token id {top}, beyond the model's {V} "
                                        "embeddings", fix)
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None and input_ids.numel():
        real = real_tokens(input_ids, attention_mask, tokenizer)
        count = int(real.sum())
        share = float((input_ids[real] == unk).sum()) / count if count else 0.0
        if count and share >= MAX_UNK_SHARE:
            raise UsageError("--model", f"the tokenizer maps {share:.0%} of the {count} text tokens to "
                                        f"{tokenizer.unk_token!r}: it does not fit this model or these texts",
                             fix + ", or give texts in the language and script the model was trained on")
    if notices is not None and hf_config is not None:
        for k in SPECIAL:
            c, t = getattr(hf_config, k, None), getattr(tokenizer, k, None)
            if isinstance(c, int) and isinstance(t, int) and c != t:
                notices.append(f"the tokenizer's {k} is {t}, the model config's is {c}")
