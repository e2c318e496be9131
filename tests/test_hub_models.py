"""Models and tokenizers by their Hugging Face hub names: a user's hub cache (HF_HOME) is used offline, a missing
model is downloaded when the network is allowed (a fake snapshot_download here), and with nothing available one
actionable message. The caches are built in tmp with small random models in the hub layout
(models--<name>/snapshots/<commit>/ + refs/main), as `from_pretrained` leaves them."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import DataNotFound
from harness.models import hub, text

REPO = Path(__file__).resolve().parent.parent
TEXT = "The cat sat on the mat. A dog ran in the park and the bird sang."


def _sha(repo: str) -> str:
    return hashlib.sha1(repo.encode()).hexdigest()


def save_bert(folder: Path) -> None:
    """A 2-layer d = 32 BERT with the bert-base-uncased vocabulary (the MiniLM package's tokenizer)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    cfg = BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64)
    BertModel(cfg).save_pretrained(folder)
    AutoTokenizer.from_pretrained(text.minilm_path()).save_pretrained(folder)


def gpt2_tokenizer_obj():
    """A small byte-level BPE tokenizer built with `tokenizers`, wrapped as GPT-2's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2TokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TEXT] * 20, trainer)
    return GPT2TokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                             unk_token="<|endoftext|>")


def save_gpt2(folder: Path, weights: bool = True) -> None:
    from transformers import GPT2Config, GPT2Model

    tok = gpt2_tokenizer_obj()
    tok.save_pretrained(folder)
    if weights:
        GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=len(tok))
                  ).save_pretrained(folder)


def put_in_cache(cache: Path, repo: str, save) -> Path:
    """models--<repo>/snapshots/<commit>/ filled by save(folder), refs/main -> commit: the snapshot folder."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / _sha(repo)
    snap.mkdir(parents=True)
    save(snap)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(_sha(repo))
    return snap


@pytest.fixture(scope="module")
def user_cache(tmp_path_factory):
    """HF_HOME of a user who downloaded bert-base-uncased and gpt2 once."""
    home = tmp_path_factory.mktemp("hf_home")
    put_in_cache(home / "hub", "bert-base-uncased", save_bert)
    put_in_cache(home / "hub", "gpt2", save_gpt2)
    return home


def _clear():
    text._cached.cache_clear()
    text.tokenizer.cache_clear()
    text.gpt2_tokenizer.cache_clear()
    hub._remote.cache_clear()


@pytest.fixture
def hf_env(monkeypatch):
    """Point huggingface_hub (which reads its settings at import) at a cache; returns set(cache, offline)."""
    from huggingface_hub import constants

    monkeypatch.delenv("ATTNLIP_DATA", raising=False)

    def set_(cache: Path, offline: bool):
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
        _clear()

    yield set_
    _clear()


def _env(home: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "ATTNLIP_")) and k != "TRANSFORMERS_OFFLINE"}
    env.update(HF_HOME=str(home), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", MPLBACKEND="Agg", **extra)
    return env


# ---- the user's cache, offline ---------------------------------------------------------------------------------
def test_analyze_names_the_cached_hub_weights(user_cache, tmp_path):
    out = tmp_path / "an"
    r = subprocess.run([sys.executable, "-m", "harness.entry", "analyze", "--model", "bert-base-uncased", "--text",
                        TEXT, "--out", str(out), "--eps", "0", "--no-progress"], cwd=REPO, env=_env(user_cache),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    src = f"hub:bert-base-uncased@{_sha('bert-base-uncased')[:12]}"
    assert src in (out / "summary.md").read_text()
    assert json.loads((out / "report.json").read_text())["source"] == src


def test_castin_gamma_runs_on_the_cached_bert(user_cache, tmp_path):
    res = tmp_path / "results"
    r = subprocess.run([sys.executable, "run_all.py", "castin_gamma", "--scale", "test", "--set",
                        "model=bert-base-uncased", "--results-dir", str(res), "--no-progress", "--no-figures"],
                       cwd=REPO, env=_env(user_cache), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    src = f"hub:bert-base-uncased@{_sha('bert-base-uncased')[:12]}"
    manifests = [json.loads(p.read_text()) for p in res.rglob("manifest.json")]
    assert src in json.dumps(manifests), "the manifest names the hub weights (also part of the cell key)"
    import pandas as pd

    table = pd.concat(pd.read_csv(p) for p in res.rglob("table.csv"))
    assert set(table["weights_source"]) == {src} and table["pretrained"].all() and set(table["d"]) == {32}


def test_cached_models_and_tokenizers_in_process(user_cache, hf_env):
    hf_env(user_cache / "hub", offline=True)
    assert text.model_source("bert-base-uncased") == f"hub:bert-base-uncased@{_sha('bert-base-uncased')[:12]}"
    assert text.model_source("gpt2", True) == f"hub:gpt2@{_sha('gpt2')[:12]}"
    tm = text.build("gpt2", True)
    assert tm.info["pretrained"] and tm.info["d"] == 32 and tm.info["causal"]
    assert len(tm.tokenizer) == len(text.gpt2_tokenizer()) < 1000  # the cached tokenizer, not another copy
    ids = text.gpt2_tokenizer()(TEXT)["input_ids"]
    assert text.gpt2_tokenizer().decode(ids) == TEXT
    # random init of the cached architecture keeps the cached tokenizer
    assert text.tokenizer("gpt2")(TEXT)["input_ids"] == ids


def test_gpt2_tokenizer_falls_back_to_the_mirror_then_fails_clearly(tmp_path, hf_env, monkeypatch):
    hf_env(tmp_path / "empty", offline=True)
    with pytest.raises(DataNotFound) as e:
        text.gpt2_tokenizer()
    msg = str(e.value)
    assert "GPT-2 tokenizer" in msg and "HF_HUB_OFFLINE" in msg and "attnlip data fetch gpt2_tokenizer" in msg
    assert "ATTNLIP_DATA" in msg and e.value.fix == "attnlip data fetch gpt2_tokenizer" and "hf download" not in msg
    mirror = tmp_path / "mirror"
    gpt2_tokenizer_obj().save_pretrained(mirror / "gpt2_tokenizer")
    monkeypatch.setenv("ATTNLIP_DATA", str(mirror))
    text.gpt2_tokenizer.cache_clear()
    assert text.gpt2_tokenizer().decode(text.gpt2_tokenizer()(TEXT)["input_ids"]) == TEXT


# ---- download on first use -----------------------------------------------------------------------------------
@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """A hub with bert-base-uncased and openai-community/gpt2 served from prepared folders: model_info and
    snapshot_download replaced; calls recorded."""
    import huggingface_hub
    from huggingface_hub import constants, errors

    served = {"bert-base-uncased": tmp_path / "served_bert", "openai-community/gpt2": tmp_path / "served_gpt2"}
    save_bert(served["bert-base-uncased"])
    save_gpt2(served["openai-community/gpt2"])
    calls = []

    class Sibling:
        def __init__(self, name):
            self.rfilename = name

    class Info:
        def __init__(self, repo):
            self.sha = _sha(repo)
            self.siblings = [Sibling(p.name) for p in served[repo].iterdir()] + [Sibling("onnx/model.onnx")]

    def model_info(repo, **kw):
        calls.append(("model_info", repo))
        if repo not in served:
            import httpx2

            resp = httpx2.Response(404, request=httpx2.Request("GET", f"https://huggingface.co/api/models/{repo}"))
            raise errors.RepositoryNotFoundError(f"404 {repo}", response=resp)
        return Info(repo)

    def snapshot_download(repo, allow_patterns=None, **kw):
        calls.append(("snapshot_download", repo, tuple(sorted(allow_patterns))))
        assert not constants.HF_HUB_OFFLINE
        return str(put_in_cache(Path(constants.HF_HUB_CACHE), repo,
                                lambda d: [shutil.copy(served[repo] / f, d / f) for f in allow_patterns]))

    monkeypatch.setattr(huggingface_hub, "model_info", model_info)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


def test_missing_model_is_downloaded_on_first_use(tmp_path, hf_env, fake_hub):
    cache = tmp_path / "cache"
    hf_env(cache, offline=False)
    planned = text.model_source("bert-base-uncased")
    assert planned == f"hub:bert-base-uncased@{_sha('bert-base-uncased')[:12]}" and not cache.exists()
    tm = text.build("bert-base-uncased", True)
    assert tm.source == planned and tm.info["pretrained"] and tm.info["d"] == 32
    (_, _, files), = [c for c in fake_hub if c[0] == "snapshot_download"]
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(files)
    assert not any("/" in f or f.endswith(".onnx") for f in files)
    assert tm.tokenizer(TEXT)["input_ids"][:2] == [101, 1996]  # [CLS] the
    # the downloaded copy is found offline afterwards, under the same source
    hf_env(cache, offline=True)
    assert text.model_source("bert-base-uncased", True) == planned


def test_gpt2_tokenizer_is_downloaded_when_not_cached(tmp_path, hf_env, fake_hub):
    hf_env(tmp_path / "cache", offline=False)
    tok = text.gpt2_tokenizer()
    assert tok.decode(tok(TEXT)["input_ids"]) == TEXT
    (_, repo, files), = [c for c in fake_hub if c[0] == "snapshot_download"]
    assert repo == "openai-community/gpt2" and "model.safetensors" not in files and "tokenizer.json" in files


def test_nothing_available_gives_one_actionable_message(tmp_path, hf_env, fake_hub):
    hf_env(tmp_path / "empty", offline=True)
    assert text.model_source("bert-base-uncased", True) == "unavailable:hub:bert-base-uncased"
    assert text.model_source("bert-base-uncased").startswith("random-init:")  # auto: seeded random init
    with pytest.raises(DataNotFound) as e:
        text.build("bert-base-uncased", True, with_tokenizer=False)
    assert "HF_HUB_OFFLINE" in str(e.value) and "hf download bert-base-uncased" in str(e.value)
    assert not fake_hub, "offline: the hub is never asked"
    hf_env(tmp_path / "empty", offline=False)
    with pytest.raises(DataNotFound) as e:
        text.build("no-such-org/no-such-model", True, with_tokenizer=False)
    assert "no model named 'no-such-org/no-such-model'" in str(e.value) and "huggingface.co/models" in str(e.value)


def test_analyze_reports_an_unknown_model_in_one_line(tmp_path, hf_env, capsys):
    from harness.entry import main

    hf_env(tmp_path / "empty", offline=True)
    assert main(["analyze", "--model", "no-such-org/no-such-model", "--text", TEXT, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 1
    assert "no-such-org/no-such-model" in err and "HF_HUB_OFFLINE" in err and "hf download" in err


def test_image_model_by_hub_name_has_no_tokenizer(tmp_path, hf_env):
    from transformers import ViTConfig, ViTModel

    from harness.analyze.inputs import load_model

    cfg = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, image_size=32,
                    patch_size=8)
    put_in_cache(tmp_path / "hub", "google/vit-base-patch16-224", lambda d: ViTModel(cfg).save_pretrained(d))
    hf_env(tmp_path / "hub", offline=True)
    model, tok, src = load_model("google/vit-base-patch16-224")
    assert tok is None and model.config.model_type == "vit"
    assert src == f"hub:google/vit-base-patch16-224@{_sha('google/vit-base-patch16-224')[:12]}"
