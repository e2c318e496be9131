"""`attnlip data fetch` and `attnlip data list` around the downloads: a --to folder that cannot be used is refused
before anything is written; the mirror layout names every folder a missing-data message asks for; the GPT-2
tokenizer is fetched by name like a dataset."""
import re
from pathlib import Path

import pytest

from harness.errors import DataNotFound
from tests.test_data_sources import SHA, env  # noqa: F401 - env: the offline fixture


def test_fetch_to_an_unusable_folder_is_one_line_and_writes_nothing(env, capsys):
    """--to a file, a symlink loop or a folder that cannot be written: exit 2, one line naming --to, nothing made."""
    import os

    from harness.data import cli

    a_file = env / "a_file"
    a_file.write_text("keep me")
    loop = env / "loop"
    loop.symlink_to(loop)
    read_only = env / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    if os.access(read_only, os.W_OK):  # root writes anywhere: a folder no one can create files in instead
        read_only = Path("/proc")
    cases = [(a_file, "is a file, not a folder"), (a_file / "sub", "is not writable"), (loop, "not a usable folder"),
             (loop / "sub", "not a usable folder"), (read_only, "is not writable"),
             (read_only / "new" / "deeper", "is not writable")]
    before = sorted(p.name for p in env.iterdir())
    for to, needle in cases:
        assert cli.main(["fetch", "alice", "--to", str(to)]) == 2, to
        out, err = capsys.readouterr()
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"attnlip data fetch: --to {to}") and needle in err, err
    assert a_file.read_text() == "keep me" and sorted(p.name for p in env.iterdir()) == before
    if read_only != Path("/proc"):
        assert not list(read_only.iterdir())


def test_mirror_layout_names_every_folder_a_missing_data_message_asks_for(env, monkeypatch, capsys):
    """Every mirror folder a missing-data message names (each dataset's, the GPT-2 tokenizer's) is in the layout
    `attnlip data list` prints, and every fix is `attnlip data fetch NAME`."""
    from huggingface_hub import constants

    from harness.data import cli, resolve, sources
    from harness.models import text as text_models
    from harness.run import fetch, preflight

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(env / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert cli.main(["list"], planner=fetch) == 0
    listed = capsys.readouterr().out
    named = {}  # folder -> the message naming it
    for name in sources.DATASETS:
        err = resolve.not_found(name, "absent")
        assert err.fix == f"attnlip data fetch {name}"
        named.update({p.rsplit("/", 1)[0] + "/": str(err) for p in sources.DATASETS[name].mirror if p in str(err)})
    text_models.gpt2_tokenizer.cache_clear()
    try:
        with pytest.raises(DataNotFound) as raised:
            text_models.gpt2_tokenizer()
    finally:
        text_models.gpt2_tokenizer.cache_clear()
    tok = preflight._tokenizer("random-init:tiny-gpt2(seed=0)")
    for msg, fix in ((str(raised.value), raised.value.fix), (tok["message"], tok["fix"])):
        assert fix == "attnlip data fetch gpt2_tokenizer" and "hf download" not in msg, msg
        named.update({m + "/": msg for m in re.findall(r"mirror folder (?:holding )?(\S+)/", msg)})
    assert "gpt2_tokenizer/" in named and len(named) >= 8, (str(raised.value), tok)
    layout = listed.split("its layout:")[1]
    for folder, msg in named.items():
        assert f"\n  {folder}" in layout, (folder, msg)
    assert re.search(r"\ngpt2_tokenizer +missing", listed)


def test_fetch_the_gpt2_tokenizer_by_name(env, monkeypatch, capsys):
    """`attnlip data fetch gpt2_tokenizer` downloads its tokenizer files through huggingface_hub (faked here)."""
    import huggingface_hub

    from harness.data import cli
    from harness.models import hub as models_hub
    from harness.run import fetch

    def fake_snapshot(repo, allow_patterns=(), revision=None, cache_dir=None, **k):
        snap = Path(cache_dir) / ("models--" + repo.replace("/", "--")) / "snapshots" / revision
        snap.mkdir(parents=True)
        for f in allow_patterns:
            (snap / f).write_text("{}")
        return str(snap)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    monkeypatch.setattr(models_hub, "remote", lambda name: models_hub.Remote(
        name, SHA, ("config.json", "vocab.json", "merges.txt", "tokenizer.json", "model.safetensors"), ""))
    dest = env / "carry"
    assert cli.main(["fetch", "gpt2_tokenizer", "--to", str(dest)]) == 2  # needs the model downloads
    assert "run it as `attnlip data fetch`" in capsys.readouterr().err
    assert cli.main(["fetch", "gpt2_tokenizer", "--to", str(dest)], planner=fetch) == 0
    assert "all 1 item(s) available: openai-community/gpt2 (tokenizer)" in capsys.readouterr().out
    snap = dest / "huggingface" / "hub" / "models--openai-community--gpt2" / "snapshots" / SHA
    assert sorted(p.name for p in snap.iterdir()) == ["config.json", "merges.txt", "tokenizer.json", "vocab.json"]


def test_data_list_with_a_broken_mirror_setting_fails_after_listing(tmp_path, monkeypatch, capsys):
    """$ATTNLIP_DATA naming no folder: the listing shows what it breaks, and the status says the setting is wrong."""
    from harness.data import cli as data_cli

    monkeypatch.setenv("ATTNLIP_DATA", str(tmp_path / "nonexistent"))
    assert data_cli.cmd_list() == 1
    cap = capsys.readouterr()
    assert "is not a folder" in cap.out and cap.err.startswith("attnlip data list: error: ") and "Traceback" not in \
        cap.err, cap.err
