"""Train a small randomly initialised Hugging Face BertForSequenceClassification on SST-2 (CPU) for certification
benchmarks (benchmarks/certify_crown.py).

Sizes (--size):
  lirpa   auto_LiRPA's examples/language Transformer: 1 layer, hidden 64, 4 heads, intermediate 128, ReLU,
          sentences of at most 32 tokens including [CLS] and [SEP].
  deept3  DeepT's "big" SST models (eth-sri/DeepT, scripts/train/train_networks_big_*.sh): 3 layers, hidden 256,
  deept12 4 heads, intermediate 512, ReLU; 3 or 12 layers.
The HF architecture differs from both originals in ways BertConfig cannot express: HF adds position and token-type
embeddings and uses the standard LayerNorm (the originals default to the "no_var" LayerNorm, x - mean(x) then the
affine map; the auto_LiRPA example also drops position/type embeddings and has a linear layer before its embedding
LayerNorm).

Tokenizer: a word-level vocabulary built from the training sentences with BertTokenizer's own normalisation and
pre-tokenisation (lower case, accents stripped, split on whitespace and punctuation), words with at least
--min-count occurrences, [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4. It is written as vocab.txt, so
`BertTokenizer(vocab.txt, do_lower_case=True)` reproduces the ids (checked on the dev set: with no "##" pieces,
WordPiece maps every word outside the vocabulary to [UNK]).

Data: --data DIR with train.tsv (header `label<TAB>sentence`) and dev.tsv (header `label<TAB>content`); the default
DIR is $ATTNLIP_DATA/sst2.

    python -m benchmarks.train_sst2_classifier --size lirpa --out /tmp/models/lirpa
"""
import argparse
import collections
import csv
import math
import os
import random
import sys
import time

import torch

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# size -> (BertConfig fields, max tokens incl. [CLS]/[SEP], default epochs, default training-time budget in minutes)
SIZES = {
    "lirpa": (dict(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                   hidden_act="relu", max_position_embeddings=64), 32, 3, 5.0),
    "deept3": (dict(num_hidden_layers=3, hidden_size=256, num_attention_heads=4, intermediate_size=512,
                    hidden_act="relu", max_position_embeddings=128), 64, 3, 12.0),
    "deept12": (dict(num_hidden_layers=12, hidden_size=256, num_attention_heads=4, intermediate_size=512,
                     hidden_act="relu", max_position_embeddings=128), 64, 2, 14.0),
}


def read_tsv(path):
    """[(sentence, label)] of a two-column tsv with a header (label first, text second)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    header = [h.strip().lower() for h in rows[0]]
    li = header.index("label")
    ti = 1 - li
    return [(r[ti], int(r[li])) for r in rows[1:] if len(r) >= 2]


def default_data_dir():
    root = os.environ.get("ATTNLIP_DATA")
    return os.path.join(root, "sst2") if root else None


def load_split(data_dir, split):
    return read_tsv(os.path.join(data_dir, split + ".tsv"))


def word_splitter():
    """The normaliser + pre-tokeniser of BertTokenizer(do_lower_case=True), as a function str -> [word]."""
    from transformers import BertTokenizer

    tok = BertTokenizer(vocab={s: i for i, s in enumerate(SPECIALS)}, do_lower_case=True)
    bt = tok.backend_tokenizer

    def split(text):
        return [w for w, _ in bt.pre_tokenizer.pre_tokenize_str(bt.normalizer.normalize_str(text))]

    return split


def build_vocab(sentences, min_count):
    """Word list: the specials, then training words seen >= min_count times (by decreasing count, then a-z)."""
    split = word_splitter()
    counts = collections.Counter(w for s in sentences for w in split(s))
    words = sorted((w for w, c in counts.items() if c >= min_count and w not in SPECIALS),
                   key=lambda w: (-counts[w], w))
    return SPECIALS + words


def check_tokenizer(tokenizer, vocab, sentences):
    """Number of sentences on which the tokenizer's ids differ from the direct word -> id lookup."""
    split = word_splitter()
    index = {w: i for i, w in enumerate(vocab)}
    bad = 0
    for s in sentences:
        want = [index["[CLS]"]] + [index.get(w, index["[UNK]"]) for w in split(s)] + [index["[SEP]"]]
        bad += tokenizer(s)["input_ids"] != want
    return bad


def encode(tokenizer, sentences, max_len):
    return tokenizer(sentences, truncation=True, max_length=max_len)["input_ids"]


def batches(ids, labels, batch_size, shuffle, rng):
    """(input_ids, attention_mask, labels) tensors, padded to the longest sentence of each batch."""
    order = list(range(len(ids)))
    if shuffle:
        rng.shuffle(order)
    for k in range(0, len(order), batch_size):
        idx = order[k:k + batch_size]
        n = max(len(ids[i]) for i in idx)
        x = torch.zeros(len(idx), n, dtype=torch.long)
        m = torch.zeros(len(idx), n, dtype=torch.long)
        for r, i in enumerate(idx):
            x[r, :len(ids[i])] = torch.tensor(ids[i])
            m[r, :len(ids[i])] = 1
        yield x, m, torch.tensor([labels[i] for i in idx])


@torch.no_grad()
def accuracy(model, ids, labels, batch_size=128):
    model.eval()
    right = 0
    for x, m, y in batches(ids, labels, batch_size, False, None):
        right += int((model(input_ids=x, attention_mask=m).logits.argmax(-1) == y).sum())
    return right / max(len(ids), 1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="lirpa")
    p.add_argument("--data", default=default_data_dir(), help="folder with train.tsv and dev.tsv")
    p.add_argument("--out", required=True, help="output folder (save_pretrained)")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--minutes", type=float, default=None, help="training-time budget; stops early when spent")
    p.add_argument("--subsample", type=int, default=0, help="use this many random training sentences (0: all)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=None, help="peak AdamW learning rate (default by size)")
    p.add_argument("--min-count", type=int, default=2)
    p.add_argument("--max-len", type=int, default=None, help="max tokens incl. [CLS]/[SEP] (default by size)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = p.parse_args(argv)
    if not a.data:
        p.error("--data not given and ATTNLIP_DATA not set")

    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    cfg_fields, max_len, epochs, minutes = SIZES[a.size]
    max_len = a.max_len or max_len
    epochs = a.epochs or epochs
    minutes = a.minutes if a.minutes is not None else minutes
    lr = a.lr or (1e-3 if a.size == "lirpa" else 3e-4)
    if a.threads:
        torch.set_num_threads(a.threads)
    random.seed(a.seed)
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)

    train = load_split(a.data, "train")
    dev = load_split(a.data, "dev")
    vocab = build_vocab([s for s, _ in train], a.min_count)
    os.makedirs(a.out, exist_ok=True)
    vocab_path = os.path.join(a.out, "vocab.txt")
    with open(vocab_path, "w", encoding="utf-8") as f:
        f.write("".join(w + "\n" for w in vocab))
    tokenizer = BertTokenizer(vocab_path, do_lower_case=True)
    bad = check_tokenizer(tokenizer, vocab, [s for s, _ in dev])
    print(f"vocab {len(vocab)} words (min count {a.min_count}); BertTokenizer(vocab.txt) ids differ from the "
          f"word lookup on {bad}/{len(dev)} dev sentences", flush=True)
    if bad:
        print("tokenizer mismatch", file=sys.stderr)
        return 1

    if a.subsample and a.subsample < len(train):
        train = rng.sample(train, a.subsample)
    tr_ids = encode(tokenizer, [s for s, _ in train], max_len)
    tr_y = [y for _, y in train]
    dv_ids = encode(tokenizer, [s for s, _ in dev], max_len)
    dv_y = [y for _, y in dev]

    config = BertConfig(vocab_size=len(vocab), num_labels=2, pad_token_id=0, **cfg_fields)
    model = BertForSequenceClassification(config)
    n_params = sum(t.numel() for t in model.parameters())
    print(f"size {a.size}: {cfg_fields}, max_len {max_len}, {n_params} parameters, {len(train)} training "
          f"sentences, {epochs} epochs, lr {lr}, budget {minutes} min", flush=True)

    decay = [t for n, t in model.named_parameters() if t.ndim >= 2 and "embeddings" not in n]
    rest = [t for n, t in model.named_parameters() if not (t.ndim >= 2 and "embeddings" not in n)]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=0.01), dict(params=rest, weight_decay=0.0)], lr=lr)
    steps_per_epoch = math.ceil(len(tr_ids) / a.batch_size)
    total = steps_per_epoch * epochs
    warm = max(1, total // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: min((k + 1) / warm, max(0.0, (total - k) / max(total - warm, 1))))

    t0 = time.perf_counter()
    step, stopped = 0, False
    for ep in range(epochs):
        model.train()
        run_loss, run_n = 0.0, 0
        for x, m, y in batches(tr_ids, tr_y, a.batch_size, True, rng):
            loss = model(input_ids=x, attention_mask=m, labels=y).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            run_loss, run_n = run_loss + loss.item(), run_n + 1
            if step % 500 == 0:
                print(f"  step {step}/{total} loss {run_loss / run_n:.4f} {time.perf_counter() - t0:.0f}s", flush=True)
                run_loss, run_n = 0.0, 0
            if time.perf_counter() - t0 > 60 * minutes:
                stopped = True
                break
        acc = accuracy(model, dv_ids, dv_y)
        print(f"epoch {ep + 1}: dev accuracy {acc:.4f} ({time.perf_counter() - t0:.0f}s)", flush=True)
        if stopped:
            print(f"time budget of {minutes} min spent after {step}/{total} steps", flush=True)
            break
    train_s = time.perf_counter() - t0
    acc = accuracy(model, dv_ids, dv_y)

    model.eval()
    try:
        model.save_pretrained(a.out, safe_serialization=True)
    except TypeError:  # transformers releases without the keyword always write safetensors
        model.save_pretrained(a.out)
    tokenizer.save_pretrained(a.out)
    reloaded = BertTokenizer.from_pretrained(a.out)
    assert check_tokenizer(reloaded, vocab, [s for s, _ in dev[:200]]) == 0, "saved tokenizer disagrees"
    print(f"RESULT size={a.size} dev_accuracy={acc:.4f} train_seconds={train_s:.1f} steps={step} "
          f"train_sentences={len(train)} out={a.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
