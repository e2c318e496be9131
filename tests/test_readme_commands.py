"""The README's shell commands run as written, in a fresh working directory, with the venv's python on PATH.

Each ```bash line of README.md is handled by what it is:
- `make <target>`: the target exists in the Makefile (running it here would reinstall);
- `source .venv/bin/activate`: the file `make install` creates is named right (checked against the venv layout);
- `attnlip ...` and `python run_all.py ...` that compute in seconds run as written (analyze on MiniLM, on a
  bert-base-uncased in a user Hugging Face cache built here, on a saved model folder with a plug-in bound from
  the working directory; `attnlip data list / fetch` offline; `--list` / `--dry-run`);
- experiment runs that would compute for minutes to hours are planned with `--dry-run` appended; `--collect`,
  `--verify` and `--render` lines are parsed by the real argument parser (running them is tested in
  test_runner_safety.py and test_verify_committed.py).
No line is skipped silently: an unknown kind of command fails the test.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_hub_models import put_in_cache, save_bert

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
HEAVY = ("--collect", "--verify", "--render")


def readme_commands():
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.splitlines():
            cmd = re.split(r"\s{2,}#", line)[0].strip()  # drop the aligned comment
            if cmd and not cmd.startswith("#"):
                out.append(cmd)
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A user's working directory: a plug-in package, a saved model, a text file; and a user HF cache."""
    wd = tmp_path_factory.mktemp("user")
    (wd / "mypkg").mkdir()
    (wd / "mypkg" / "__init__.py").write_text("")
    (wd / "mypkg" / "bounds.py").write_text(
        "from harness.bounds import jasmin\n\n\ndef my_bound(X, w, causal=False):\n"
        "    return 2 * jasmin.bound(X, w, causal=causal)\n")
    save_bert(wd / "my_saved_model")
    _classifiers(wd)
    (wd / "texts.txt").write_text("The cat sat on the mat.\nA dog ran in the park.\n")
    home = tmp_path_factory.mktemp("hf_home")
    put_in_cache(home / "hub", "bert-base-uncased", save_bert)
    return wd, home


def _classifiers(wd: Path) -> None:
    """The README's `attnlip certify` models: a small BERT sentence classifier with its tokenizer, a small ViT and
    a .npy batch of images (random weights: the commands are what is tested)."""
    import numpy as np
    import torch
    from transformers import (BertConfig, BertForSequenceClassification, BertTokenizer, ViTConfig,
                              ViTForImageClassification)

    torch.manual_seed(0)
    words = "[PAD] [UNK] [CLS] [SEP] [MASK] a the film movie gripping funny cat sat on mat dog ran in park , .".split()
    (wd / "my-sst2-bert").mkdir()
    (wd / "my-sst2-bert" / "vocab.txt").write_text("\n".join(words) + "\n")
    BertTokenizer(str(wd / "my-sst2-bert" / "vocab.txt")).save_pretrained(wd / "my-sst2-bert")
    BertForSequenceClassification(BertConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=1,
                                             num_attention_heads=2, intermediate_size=32,
                                             max_position_embeddings=32)).save_pretrained(wd / "my-sst2-bert")
    ViTForImageClassification(ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=32, image_size=8, patch_size=4,
                                        num_labels=3)).save_pretrained(wd / "my-vit")
    np.save(wd / "imgs.npy", np.random.default_rng(0).random((2, 8, 8, 3)).astype("float32"))


def _env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "ATTNLIP_"))}
    env.update(HF_HOME=str(home), HF_HUB_OFFLINE="1", ATTNLIP_OFFLINE="1", OMP_NUM_THREADS="1", MPLBACKEND="Agg",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    return env


def _argv(cmd: str):
    """The command as argv with this interpreter: `attnlip` -> harness.entry, `python run_all.py` -> the repo's."""
    args = shlex.split(cmd)
    if args[0] == "attnlip":
        return [sys.executable, "-m", "harness.entry", *args[1:]]
    if args[:2] == ["python", "run_all.py"]:
        return [sys.executable, str(REPO / "run_all.py"), *args[2:]]
    raise AssertionError(f"README command of an unknown kind (add it to this test): {cmd}")


def test_readme_has_the_commands_this_test_knows():
    cmds = readme_commands()
    assert any(c.startswith("attnlip analyze") for c in cmds) and any("run_all.py" in c for c in cmds)
    assert "make test" in README.read_text() and "make install" in cmds


@pytest.mark.parametrize("cmd", readme_commands())
def test_readme_command_runs_as_written(cmd, workdir):
    wd, home = workdir
    if cmd.startswith("make "):
        target = cmd.split()[1]
        assert re.search(rf"^{re.escape(target)}:", (REPO / "Makefile").read_text(), flags=re.M), cmd
        return
    if cmd.startswith("source "):
        assert cmd.split()[1] == ".venv/bin/activate"
        assert (Path(sys.prefix) / "bin" / "activate").is_file() or sys.prefix == sys.base_prefix
        return
    argv = _argv(cmd)
    if any(h in argv for h in HEAVY):
        from harness.cli import build_parser

        build_parser().parse_args(argv[2:])  # exits 2 (SystemExit) on an option the CLI does not have
        return
    if "run_all.py" in argv[1] and not ({"--list", "--dry-run"} & set(argv)):
        argv.append("--dry-run")
    r = subprocess.run(argv, cwd=wd, env=_env(home), capture_output=True, text=True, timeout=600)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    if argv[3:5] == ["data", "fetch"]:  # offline here: it must say what it could not get, exit 1
        assert r.returncode in (0, 1) and ("could not" in (r.stdout + r.stderr).lower() or r.returncode == 0)
        return
    assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-3000:])
