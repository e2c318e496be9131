"""A tiny data mirror with the layout of $ATTNLIP_DATA (harness.data.sources.MIRROR_LAYOUT), for tests.

    build(root) -> root      writes every text corpus the mirror carries, in the files and formats the loaders
                             (harness.data.text, harness.analyze.inputs, NLTK's corpus readers) read, plus a small
                             GPT-2-style byte-level BPE tokenizer in gpt2_tokenizer/

The content is synthetic English-like text from a seeded word generator: deterministic (same bytes on every
build, zip members carry a fixed timestamp), a few hundred kilobytes, built in well under a second. Sizes are far
below the real corpora's (tests that need the real counts use the real mirror); they are large enough for every
test-scale cell and for the quick scale's token windows. The image datasets (fashion-mnist/, cifar-10-batches-py/,
cifar-100-python/) are left out: they have their own sources (Debian's package, ATTNLIP_FASHION_MNIST,
ATTNLIP_CIFAR10, ATTNLIP_CIFAR100), which a fake copy in the mirror would shadow.
"""
from __future__ import annotations

import csv
import io
import random
import zipfile
from pathlib import Path
from typing import List, Tuple

SEED = 0
EOT = "<|endoftext|>"  # GPT-2's one special token: bos, eos and unk, the last id of the vocabulary
LEFT_OUT = ("fashion_mnist", "cifar10", "cifar100")  # image datasets: their own sources, a fake copy would shadow
TOKENIZER_VOCAB = 1000  # target size of the trained BPE vocabulary (GPT-2 has 50,257)

NOUNS = ("rabbit queen king hatter cat garden door key table bottle cake tea party hole house river tree "
         "mouse turtle duchess baby pig caterpillar mushroom croquet court jury trial tart glove fan watch "
         "clock hedgehog flamingo lobster dance song story lesson sister book picture daisy chain window").split()
VERBS = ("said thought went ran looked found took saw began cried asked whispered shouted opened grew "
         "fell walked sat remembered wondered answered tried turned heard knew felt").split()
ADJS = ("little large curious tired sleepy strange small tall golden white grey angry gentle loud quiet "
        "merry dreadful beautiful old young queer").split()
LINKS = ("and but so then while because when as if though").split()
PREPS = ("into under over near behind beside through across down up along").split()
NAMES = ("Alice", "the Queen", "the Hatter", "the Rabbit", "the Duchess", "the Gryphon", "the Dormouse")
POSITIVE = ("wonderful charming delightful moving brilliant funny warm clever touching lovely").split()
NEGATIVE = ("dull tedious clumsy boring flat tired awkward lifeless shallow painful").split()
TOPICS = (  # AG_NEWS classes 1..4: World, Sports, Business, Sci/Tech
    ("minister election talks border government leaders peace capital", "World"),
    ("team season match coach players league championship goal", "Sports"),
    ("shares profit market company prices investors quarter bank", "Business"),
    ("software internet computer researchers space network phone chip", "Sci/Tech"),
)


def _phrase(rng: random.Random) -> str:
    subj = rng.choice(NAMES) if rng.random() < 0.5 else f"the {rng.choice(ADJS)} {rng.choice(NOUNS)}"
    obj = f"the {rng.choice(ADJS)} {rng.choice(NOUNS)}" if rng.random() < 0.6 else f"the {rng.choice(NOUNS)}"
    return f"{subj} {rng.choice(VERBS)} {rng.choice(PREPS)} {obj}"


def sentence(rng: random.Random) -> str:
    """One English-like sentence: one to three clauses, capitalized, ending in . ! or ?; some are quoted."""
    s = _phrase(rng)
    for _ in range(rng.randint(0, 2)):
        s += f"{',' if rng.random() < 0.5 else ''} {rng.choice(LINKS)} {_phrase(rng)}"
    s = s[0].upper() + s[1:] + rng.choice(".....!?")
    if rng.random() < 0.15:
        s = f"'{s}' {rng.choice(('said', 'thought', 'cried'))} {rng.choice(NAMES)}."
    return s


def paragraph(rng: random.Random, lo: int = 2, hi: int = 5) -> str:
    return " ".join(sentence(rng) for _ in range(rng.randint(lo, hi)))


def _wrap(text: str, width: int = 72) -> str:
    lines, line = [], ""
    for w in text.split():
        if line and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}" if line else w
    return "\n".join(lines + [line])


def alice_text(rng: random.Random, chapters: int = 12, paras: int = 30) -> str:
    """Gutenberg-style plain text: title line, chapter headings, wrapped paragraphs separated by blank lines."""
    out = ["[Alice's Adventures in Wonderland by Lewis Carroll 1865]"]
    for c in range(1, chapters + 1):
        out.append(f"CHAPTER {c}. The {rng.choice(ADJS).capitalize()} {rng.choice(NOUNS).capitalize()}")
        out.append(_wrap("Alice was beginning to get very tired. " + paragraph(rng)))
        out += [_wrap(paragraph(rng)) for _ in range(paras - 1)]
    return "\n\n".join(out) + "\n"


def _tokens(s: str) -> List[str]:
    """SST-2 style tokenization: lower case, punctuation split off."""
    for p in ".,!?'":
        s = s.replace(p, f" {p} ")
    return s.lower().split()


def sst2_rows(rng: random.Random, n: int) -> List[Tuple[int, str]]:
    """(label, sentence) with the label carried by a sentiment word (positive -> 1), so it can be learned."""
    rows = []
    for _ in range(n):
        y = rng.randint(0, 1)
        word = rng.choice(POSITIVE if y else NEGATIVE)
        core = _tokens(sentence(rng))[:rng.randint(4, 14)]
        core.insert(rng.randint(0, len(core)), word)
        rows.append((y, " ".join(core)))
    return rows


def ag_news_rows(rng: random.Random, n: int) -> List[Tuple[int, str, str]]:
    """(label 1..4, title, description); each class has its own topic words."""
    rows = []
    for _ in range(n):
        y = rng.randint(1, 4)
        words = TOPICS[y - 1][0].split()
        title = " ".join(rng.choice(words).capitalize() for _ in range(rng.randint(3, 6)))
        desc = f"{sentence(rng)[:-1]}, {' '.join(rng.sample(words, 3))} ({TOPICS[y - 1][1]})."
        rows.append((y, title, desc))
    return rows


def brown_files(rng: random.Random) -> List[Tuple[str, str, str]]:
    """(fileid, category, text) in the Brown corpus's tagged format: paragraphs separated by blank lines, one
    sentence a line (tab-indented), tokens word/tag."""
    tags = {**{w: "nn" for w in NOUNS}, **{w: "vbd" for w in VERBS}, **{w: "jj" for w in ADJS},
            **{w: "cc" for w in LINKS}, **{w: "in" for w in PREPS}, "the": "at", ".": ".", ",": ",", "!": ".",
            "?": ".", "'": "'", "alice": "np"}
    out = []
    for fid, cat in (("ca01", "news"), ("cb01", "editorial"), ("cr01", "humor")):
        paras = []
        for _ in range(12):
            sents = [" ".join(f"{w}/{tags.get(w, 'nn')}" for w in _tokens(sentence(rng)))
                     for _ in range(rng.randint(1, 4))]
            paras.append("\n".join(f"\t{s}" for s in sents))
        out.append((fid, cat, "\n\n\n" + "\n\n\n".join(paras) + "\n"))
    return out


def _zip(path: Path, members: List[Tuple[str, str]]) -> None:
    """A zip with NLTK's package shape (a top folder entry, then its files), fixed timestamps: same bytes always."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        top = members[0][0].split("/")[0] + "/"
        z.writestr(zipfile.ZipInfo(top, date_time=(2000, 1, 1, 0, 0, 0)), "")
        for name, data in members:
            z.writestr(zipfile.ZipInfo(name, date_time=(2000, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)


def gpt2_tokenizer(folder: Path, texts: List[str]) -> None:
    """A GPT-2-shaped tokenizer trained on `texts`: byte-level BPE (no prefix space, no added bos/eos), the one
    special token <|endoftext|> as the last id, saved by transformers as GPT2TokenizerFast."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast

    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(texts, vocab_size=TOKENIZER_VOCAB - 1, min_frequency=2, show_progress=False)
    bpe.add_special_tokens([EOT])
    tok = GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, bos_token=EOT, eos_token=EOT, unk_token=EOT,
                            add_prefix_space=False, model_max_length=1024)
    tok.save_pretrained(str(folder))


def build(root: Path) -> Path:
    """Write the tiny mirror under root (created if needed) and return root."""
    rng = random.Random(SEED)
    root = Path(root)
    corpora = root / "nltk_data" / "corpora"
    (corpora / "gutenberg").mkdir(parents=True, exist_ok=True)
    alice = alice_text(rng)
    (corpora / "gutenberg" / "carroll-alice.txt").write_text(alice, encoding="ascii")

    brown = brown_files(rng)
    _zip(corpora / "brown.zip", [(f"brown/{f}", t) for f, _, t in brown] +
         [("brown/cats.txt", "".join(f"{f} {c}\n" for f, c, _ in brown)),
          ("brown/README", "A tiny synthetic stand-in for the Brown corpus, in its tagged format.\n")])

    pol = {y: [" ".join(_tokens(f"{sentence(rng)[:-1]}, {rng.choice(words)}.")) for _ in range(100)]
           for y, words in (("pos", POSITIVE), ("neg", NEGATIVE))}  # one sentence a line, as rt-polarity.*
    _zip(corpora / "sentence_polarity.zip",
         [("sentence_polarity/README.txt", "A tiny synthetic stand-in for the sentence polarity dataset.\n")] +
         [(f"sentence_polarity/rt-polarity.{y}", "\n".join(s) + "\n") for y, s in pol.items()])

    (root / "sst2").mkdir(exist_ok=True)
    for split, col, n in (("train", "sentence", 2000), ("dev", "content", 200)):
        lines = [f"label\t{col}"] + [f"{y}\t{s}" for y, s in sst2_rows(rng, n)]
        (root / "sst2" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")

    (root / "ag_news").mkdir(exist_ok=True)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(("label", "title", "description"))
    w.writerows(ag_news_rows(rng, 400))
    (root / "ag_news" / "test.csv").write_text(buf.getvalue(), encoding="utf-8")

    texts = alice.split("\n\n") + [s for ss in pol.values() for s in ss]
    gpt2_tokenizer(root / "gpt2_tokenizer", texts)
    (root / "README.md").write_text("Tiny synthetic data mirror built by the test suite (tests/_tiny_mirror.py); "
                                    f"layout as `attnlip data list` prints; seed {SEED}.\n")
    return root
