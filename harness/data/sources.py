"""The datasets the toolkit reads, each with its canonical source(s) and its place in the optional mirror.

    DATASETS[name] -> Dataset(name, what, nltk=..., hub=..., debian=..., mirror=...)

Sources, in the order harness.data.resolve tries them:
  mirror  files under $ATTNLIP_DATA (MIRROR_LAYOUT below), when that variable is set and holds them;
  nltk    NLTK's downloader package (`nltk.download(<package>)`), found on NLTK's data path ($NLTK_DATA, ~/nltk_data,
          /usr/share/nltk_data, ...);
  debian  a Debian package unpacked by `make data` into <repo>/.data, or installed under /usr/share;
  hub     a Hugging Face hub dataset read through `datasets` (its own cache, $HF_DATASETS_CACHE or $HF_HOME/datasets).
`default` marks what the default experiment run reads; `attnlip data fetch` with no names fetches those.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class Hub:
    """A Hugging Face hub dataset: repository, config, the split names the loaders use (mirror name -> hub
    name), the text columns, the image column and the label column (CIFAR-100's fine labels: "fine_label")."""

    repo: str
    config: Optional[str] = None
    splits: Tuple[Tuple[str, str], ...] = (("train", "train"), ("test", "test"))
    text: Tuple[str, ...] = ()
    image: str = "image"
    label: str = "label"

    def split(self, name: str) -> str:
        return dict(self.splits).get(name, name)


@dataclass(frozen=True)
class Dataset:
    name: str
    what: str
    nltk: Optional[str] = None          # NLTK downloader package
    nltk_resource: Optional[str] = None  # resource path on NLTK's data path (directory or file)
    hub: Optional[Hub] = None
    debian: Optional[str] = None        # Debian package name
    env: Optional[str] = None           # variable naming a local folder that takes precedence over the mirror
    mirror: Tuple[str, ...] = ()        # files under $ATTNLIP_DATA that make the mirror usable
    default: bool = False
    notes: Tuple[str, ...] = field(default=())

    @property
    def sources(self) -> Tuple[str, ...]:
        """Canonical sources, as "nltk:<package>", "debian:<package>", "hf:<repo>[/<config>]"."""
        out = []
        if self.nltk:
            out.append(f"nltk:{self.nltk}")
        if self.debian:
            out.append(f"debian:{self.debian}")
        if self.hub:
            out.append(f"hf:{self.hub.repo}" + (f"/{self.hub.config}" if self.hub.config else ""))
        return tuple(out)


DATASETS: Dict[str, Dataset] = {d.name: d for d in (
    Dataset("alice", "Alice in Wonderland (Gutenberg carroll-alice.txt), one text per paragraph",
            nltk="gutenberg", nltk_resource="corpora/gutenberg/carroll-alice.txt",
            mirror=("nltk_data/corpora/gutenberg/carroll-alice.txt",), default=True),
    Dataset("brown", "the Brown corpus, one text per paragraph", nltk="brown", nltk_resource="corpora/brown",
            mirror=("nltk_data/corpora/brown.zip",)),
    Dataset("sentence_polarity", "Pang & Lee sentence polarity (rt-polarity.pos/.neg)", nltk="sentence_polarity",
            nltk_resource="corpora/sentence_polarity", mirror=("nltk_data/corpora/sentence_polarity.zip",)),
    Dataset("sst2", "GLUE SST-2: train (67,349) and dev (872) sentences, labels 0/1",
            hub=Hub("stanfordnlp/sst2", splits=(("train", "train"), ("dev", "validation")), text=("sentence",)),
            mirror=("sst2/train.tsv", "sst2/dev.tsv"), default=True),
    Dataset("ag_news", "AG_NEWS test split (7,600): 'title description', labels 0..3",
            hub=Hub("fancyzhx/ag_news", text=("text",)), mirror=("ag_news/test.csv",), default=True),
    Dataset("fashion_mnist", "Fashion-MNIST 28x28 grayscale, 60,000 train + 10,000 test",
            hub=Hub("zalando-datasets/fashion_mnist"), debian="dataset-fashion-mnist", env="ATTNLIP_FASHION_MNIST",
            mirror=("fashion-mnist/t10k-images-idx3-ubyte.gz",), default=True),
    Dataset("cifar10", "CIFAR-10 32x32 RGB, 50,000 train + 10,000 test",
            hub=Hub("uoft-cs/cifar10", image="img"), env="ATTNLIP_CIFAR10", mirror=("cifar-10-batches-py/test_batch",)),
    Dataset("cifar100", "CIFAR-100 32x32 RGB, 50,000 train + 10,000 test, 100 fine classes",
            hub=Hub("uoft-cs/cifar100", image="img", label="fine_label"), env="ATTNLIP_CIFAR100",
            mirror=("cifar-100-python/test",)),
    Dataset("svhn", "SVHN cropped digits 32x32 RGB, 73,257 train + 26,032 test",
            hub=Hub("ufldl-stanford/svhn", config="cropped_digits")),
)}

DEFAULT = tuple(n for n, d in DATASETS.items() if d.default)


@dataclass(frozen=True)
class HubFiles:
    """Files of a Hugging Face model repository that cells read besides the datasets, fetched by name like a
    dataset (`attnlip data fetch NAME`, through huggingface_hub into its cache) or read from a mirror folder."""

    name: str
    what: str
    repo: str    # hub repository
    kind: str    # "tokenizer": its tokenizer files only
    mirror: str  # folder under $ATTNLIP_DATA holding the same files


HUB_FILES: Dict[str, HubFiles] = {h.name: h for h in (
    HubFiles("gpt2_tokenizer", "the GPT-2 tokenizer, read by random-init GPT-2 models", "openai-community/gpt2",
             "tokenizer", "gpt2_tokenizer"),
)}
GPT2_TOKENIZER = HUB_FILES["gpt2_tokenizer"]

DATASET_LAYOUT = """\
  nltk_data/corpora/gutenberg/carroll-alice.txt   alice (NLTK's file)
  nltk_data/corpora/brown.zip                     brown (NLTK's package)
  nltk_data/corpora/sentence_polarity.zip         sentence_polarity (NLTK's package)
  sst2/train.tsv                                  header label<TAB>sentence
  sst2/dev.tsv                                    header label<TAB>content
  ag_news/test.csv                                header label,title,description; labels 1-4
  fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
  cifar-10-batches-py/data_batch_1..5, test_batch (python pickle format)
  cifar-100-python/train, test, meta (python pickle format)"""
# every folder a missing-data message names is in the layout: the datasets' files above, the hub files' folders here
MIRROR_LAYOUT = "$ATTNLIP_DATA/\n" + DATASET_LAYOUT + "".join(
    f"\n  {h.mirror + '/':46s}  {h.what}: {h.repo}'s {h.kind} files" for h in HUB_FILES.values())


def get(name: str) -> Dataset:
    """The table entry of a dataset; an unknown name is a ValueError listing the known ones."""
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}") from None
