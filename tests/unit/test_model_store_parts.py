"""Model management's pure parts (docs/api.md, "Managing models"): what a pulled name means,
the Modelfile subset, the progress lines, the free-space check (the disk's free bytes are
injected here; tests/e2e/test_model_store.py fills a real 1 MiB tmpfs), a pull over a fake hub
object (resume, verification), a folder's own settings, and the huggingface_hub names pinned."""

from __future__ import annotations

import hashlib
import inspect
import io

import pytest

from mlxd.shared.config import ModelSettings
from mlxd.shared.errors import BadGateway, BadRequest, Conflict, PayloadTooLarge
from mlxd.shared.folder_settings import (
    FolderSettings,
    folder_settings_of,
    read_folder_settings,
    section_over_folder,
    write_folder_settings,
)
from mlxd.shared.wire.ollama_manage import ProgressLine
from mlxd.supervisor.ctl.pull import Printer
from mlxd.supervisor.store import folders, progress, puller
from mlxd.supervisor.store.hub import Manifest, RemoteFile
from mlxd.supervisor.store.modelfile import folder_settings, parse_modelfile
from mlxd.supervisor.store.names import new_model_id, pull_target


def test_a_pull_names_a_hugging_face_repository_or_a_name_of_the_table():
    t = pull_target("mlx-community/Qwen3-8B-4bit")
    assert (t.model_id, t.repo, t.key) == (t.repo, t.repo, "mlx-community--Qwen3-8B-4bit")
    assert pull_target("hf.co/org/m:latest").model_id == "org/m"
    assert pull_target("qwen3:0.6b").repo == "mlx-community/Qwen3-0.6B-4bit"
    assert pull_target("qwen3").model_id == "qwen3"  # qwen3:latest, listed as such
    assert pull_target("Qwen3:8B").model_id == "qwen3:8b"
    with pytest.raises(BadRequest, match="not a name mlxd knows.*qwen3:0.6b"):
        pull_target("llava:7b")
    with pytest.raises(BadRequest, match="takes no tag"):
        pull_target("org/m:Q4_K_M")
    for bad in ("org/../x", "org/m/x", "/abs/x", "org/"):
        with pytest.raises(BadRequest):
            pull_target(bad)
    assert new_model_id("mine:latest") == "mine" and new_model_id("me/mine:v2") == "me/mine:v2"
    for bad in ("../x", "a/b/c", ".hidden", "a b", "x:"):
        with pytest.raises(BadRequest, match="Invalid 'model'"):
            new_model_id(bad)


MODELFILE = '''# made by hand
FROM /models/base.gguf
parameter temperature 0.2
PARAMETER num_ctx 2048
PARAMETER num_predict -1
SYSTEM """You are terse.
Very terse."""
TEMPLATE "{{ messages[0]['content'] }}"
'''


def test_a_modelfile_subset_becomes_the_model_settings():
    spec = parse_modelfile(MODELFILE)
    assert spec.source == "/models/base.gguf"
    assert spec.system == "You are terse.\nVery terse."
    fs = folder_settings(spec)
    assert fs.values() == {
        "temperature": 0.2,
        "context_limit": 2048,  # num_ctx; num_predict -1 is "up to the context": unset
        "system": "You are terse.\nVery terse.",
        "chat_template": "{{ messages[0]['content'] }}",
    }
    for text, named in (
        ("FROM a\nADAPTER ./lora", "ADAPTER is not supported"),
        ("FROM a\nPARAMETER stop <|im_end|>\nPARAMETER stop x", "PARAMETER stop is not supported"),
        ("FROM a\nPARAMETER temperature 5", "PARAMETER temperature: Input should be less"),
        ("FROM a\nPARAMETER top_k many", "PARAMETER top_k: 'many' is not a number"),
        ("FROM a\nTEMPLATE {{ .System }} {{ .Prompt }}", "Go template"),
        ("FROM a\nTEMPLATE {% if %}", "not valid Jinja"),
        ("FROM a\nQUANTIZE q4", "unknown instruction QUANTIZE"),
        ('FROM a\nSYSTEM """never closed', "not closed"),
    ):
        with pytest.raises(BadRequest, match=named):
            folder_settings(parse_modelfile(text))


def test_progress_lines_are_throttled_and_replayed_to_late_clients():
    now = [0.0]
    throttle = progress.Throttle(lambda: now[0], interval_s=0.25)
    assert throttle.due("f", False)  # a file's first line
    assert not throttle.due("f", False)
    assert throttle.due("f", True)  # and its last, whatever the time
    now[0] = 0.3
    assert throttle.due("f", False) and throttle.due("g", False)
    f = RemoteFile("model.safetensors", 2048, sha256="ab" * 32)
    backlog: list[ProgressLine] = []
    for line in (
        progress.line(progress.MANIFEST),
        progress.file_line(f, 0),
        progress.file_line(f, 1024),
        progress.line(progress.VERIFYING),
    ):
        progress.add_to_backlog(backlog, line)
    assert [(x.status, x.completed) for x in backlog] == [
        ("pulling manifest", None),
        ("pulling model.safetensors", 1024),  # a file's latest line only
        ("verifying sha256 digest", None),
    ]
    assert backlog[1].to_dict()["digest"] == "sha256:" + "ab" * 32
    assert progress.line_text(backlog[1]) == "pulling model.safetensors  1 KiB / 2 KiB (50%)"
    out = io.StringIO()  # mlxctl, not on a terminal: a line per status and tenth of a file
    printer = Printer(out)
    for done in (0, 100, 1024, 1100, 2048):
        printer.show(progress.file_line(f, done))
    assert len(out.getvalue().splitlines()) == 3


def test_free_space_is_checked_with_both_sizes_named():
    folders.check_room("'m'", 1 << 20, 1 << 30)
    with pytest.raises(PayloadTooLarge, match=r"needs 100 MiB more, 20 MiB is free"):
        folders.check_room("'m'", 100 << 20, 20 << 20)


class StubHub:
    """A hub object in memory: files by name; `damage` serves one of them with a byte flipped;
    `stop_after` raises after that many bytes of a download (an interruption)."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.damage: str | None = None
        self.stop_after: int | None = None
        self.fetched: list[tuple[str, int]] = []  # (file, the bytes it started from)

    def manifest(self, repo, revision):
        listed = tuple(
            RemoteFile(n, len(d), sha256=hashlib.sha256(d).hexdigest())
            for n, d in self.files.items()
        )
        return Manifest(repo, "c0ffee", listed)

    def fetch(self, repo, commit, file, part, on_bytes):
        have = part.stat().st_size if part.exists() else 0
        self.fetched.append((file.name, have))
        data = self.files[file.name]
        if file.name == self.damage:
            data = data[:-1] + bytes([data[-1] ^ 1])
        with part.open("ab") as out:
            for i in range(have, len(data), 100):
                if self.stop_after is not None and i >= self.stop_after:
                    raise ConnectionError("dropped")
                on_bytes(len(data[i : i + 100]))  # before the write, as http_get does
                out.write(data[i : i + 100])


def safetensors(n: int) -> bytes:
    """A readable safetensors file of one `n`-byte tensor."""
    header = f'{{"w":{{"dtype":"U8","shape":[{n}],"data_offsets":[0,{n}]}}}}'.encode()
    return len(header).to_bytes(8, "little") + header + bytes(i % 256 for i in range(n))


def _pull(hub, models, **kw):
    lines: list[ProgressLine] = []
    folder = puller.pull(pull_target("org/m"), models, hub, emit=lines.append, **kw)
    return folder, [x.status for x in lines]


def test_a_pull_goes_on_from_its_bytes_verifies_and_checks_the_disk_first(tmp_path):
    models = tmp_path / "models"
    weights = safetensors(1000)
    hub = StubHub({"config.json": b"{}", "model.safetensors": weights})
    with pytest.raises(PayloadTooLarge, match="not enough disk space for 'org/m'"):
        _pull(hub, models, free_bytes=lambda path: 1000)
    assert hub.fetched == [] and list(models.iterdir()) == []  # refused before any byte

    hub.stop_after = 500
    with pytest.raises(ConnectionError):
        _pull(hub, models)
    assert not (models / "org").exists()  # nothing half-made is a model
    hub.stop_after, hub.damage = None, "model.safetensors"
    with pytest.raises(BadGateway, match="model.safetensors of org/m does not match its checksum"):
        _pull(hub, models)
    assert ("model.safetensors", 500) in hub.fetched  # it went on from the 500 bytes it had
    assert not (models / ".downloads" / "org--m" / "model.safetensors.part").exists()

    hub.damage = None
    folder, statuses = _pull(hub, models)
    assert folder == models / "org" / "m"
    assert (folder / "model.safetensors").read_bytes() == weights
    assert statuses[0] == "pulling manifest" and statuses[-3:] == [
        "verifying sha256 digest",
        "writing manifest",
        "success",
    ]
    assert sorted(p.name for p in models.iterdir()) == ["org"]  # no .downloads/ left
    hub.fetched.clear()
    assert _pull(hub, models)[1] == ["pulling manifest", "success"]  # up to date
    assert hub.fetched == []
    (models / "org" / "m" / puller.STATE).write_text('{"commit": "older"}')
    with folders.exclusive(models, "org--m", "a download of 'org/m'"):  # mlxctl's, say
        with pytest.raises(Conflict, match="a download of 'org/m' is already under way"):
            _pull(hub, models)


def test_a_repository_without_config_json_is_not_a_model_folder():
    listing = Manifest("o/g", "c", (RemoteFile("m.gguf", 9), RemoteFile("../x.json", 1)))
    with pytest.raises(BadRequest, match="not an MLX model folder.*GGUF"):
        puller.model_files(listing)
    files = (RemoteFile("config.json", 2), RemoteFile("sub/x.json", 1), RemoteFile("a.bin", 9))
    with pytest.raises(BadRequest, match="no .safetensors weights"):  # a probe, 2026-12-07
        puller.model_files(Manifest("o/m", "c", files))
    ok = Manifest("o/m", "c", (*files, RemoteFile("m.safetensors", 9)))
    # top-level names only
    assert [f.name for f in puller.model_files(ok)] == ["config.json", "m.safetensors"]


def test_weights_that_match_their_checksum_but_are_no_safetensors_fail_the_pull(tmp_path):
    """A probe (2026-12-07): such a pull said success, and the model was FATAL at its load."""
    models = tmp_path / "models"
    hub = StubHub({"config.json": b"{}", "model.safetensors": b"not a safetensors file" * 9})
    with pytest.raises(BadRequest, match="model.safetensors of org/m is not a readable"):
        _pull(hub, models)
    assert not (models / "org").exists()


def test_pulls_at_once_count_each_others_outstanding_bytes(tmp_path):
    """A probe (2026-12-07): three pulls on a 40 MiB disk each fitted alone, all three ran,
    and all three failed with the disk full. Bytes landing free the reservation as they go."""
    out = puller.Outstanding()
    mib = 1 << 20  # each check also leaves 16 MiB free (folders.HEADROOM_BYTES)
    with out.reserve("a", "'a'", 20 * mib, 60 * mib) as fetched:
        with pytest.raises(PayloadTooLarge, match="other pulls still need 20 MiB"):
            with out.reserve("b", "'b'", 30 * mib, 60 * mib):  # 30 + 20 + 16 > 60
                pass
        fetched(8 * mib)  # 8 MiB of a's landed: 52 MiB free, a needs 12 more
        with out.reserve("b", "'b'", 24 * mib, 52 * mib):  # 24 + 12 + 16 = 52
            pass
    with out.reserve("b", "'b'", 44 * mib, 60 * mib):  # a ended: all of it is b's
        pass
    # pull() checks through it: a pull that fits alone is refused beside another's bytes
    hub = StubHub({"config.json": b"{}", "model.safetensors": safetensors(1000)})
    free = lambda path: 17 * mib  # noqa: E731 - 16 MiB of headroom and ~1 KiB to fetch
    with out.reserve("other", "'other'", mib, 18 * mib):
        with pytest.raises(PayloadTooLarge, match="other pulls still need 1 MiB"):
            _pull(hub, tmp_path / "models", free_bytes=free, outstanding=out)
    assert _pull(hub, tmp_path / "models", free_bytes=free, outstanding=out)[0].is_dir()


def test_a_folders_own_settings_sit_under_the_config_section(tmp_path):
    write_folder_settings(tmp_path, FolderSettings(temperature=0.3, system="Be brief."))
    fs = read_folder_settings(tmp_path)
    assert fs is not None and fs.values() == {"temperature": 0.3, "system": "Be brief."}
    section = ModelSettings(temperature=0.9, keep_alive_s=5)
    merged = section_over_folder(section, fs)
    assert (merged.temperature, merged.system, merged.keep_alive_s) == (0.9, "Be brief.", 5)
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    carried = folder_settings_of(ModelSettings(chat_template=str(template), top_k=4))
    assert carried.values() == {"top_k": 4, "chat_template": "{{ messages }}"}
    (tmp_path / "mlxd.json").write_text('{"temperature": 9}')
    assert read_folder_settings(tmp_path) is None  # out of bounds: ignored


def test_a_created_models_settings_come_back_at_the_next_start(tmp_path):
    from fake_workers import make_models, settings_for

    from mlxd.supervisor.catalog.catalog import Catalog

    make_models(tmp_path, "made", "plain")
    write_folder_settings(tmp_path / "models" / "made", FolderSettings(system="Be brief.", top_k=5))
    settings = settings_for(tmp_path, models={"made": {"top_k": 7}})  # config.toml's section
    catalog = Catalog(settings)
    catalog.apply_folder_settings()  # what the daemon does at start
    made = settings.for_model("made")
    assert (made.system, made.top_k) == ("Be brief.", 7)  # the section's key wins
    assert "plain" not in settings.models
    (tmp_path / "models" / "made" / "mlxd.json").unlink()
    catalog.apply_folder_settings("made")
    assert settings.models["made"].system is None and settings.models["made"].top_k == 7


def test_huggingface_hubs_names_used_by_the_pull_are_there():
    """hub.py relies on these on the installed huggingface_hub; an upgrade that moves one
    fails here, not in a user's pull."""
    from huggingface_hub import HfApi, constants, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.hf_api import BlobLfsInfo, RepoSibling
    from huggingface_hub.utils import build_hf_headers

    params = inspect.signature(http_get).parameters
    for name in ("resume_size", "headers", "expected_size", "displayed_filename", "tqdm_class"):
        assert name in params
    assert isinstance(constants.DOWNLOAD_CHUNK_SIZE, int)
    assert "files_metadata" in inspect.signature(HfApi.model_info).parameters
    assert "endpoint" in inspect.signature(hf_hub_url).parameters
    assert {"rfilename", "size", "blob_id", "lfs"} <= set(RepoSibling.__dataclass_fields__)
    assert "sha256" in BlobLfsInfo.__dataclass_fields__
    assert callable(build_hf_headers)


def test_a_new_model_never_takes_the_place_of_other_models(tmp_path):
    models = tmp_path / "models"
    for folder in (models / "org" / "m", models / "solo"):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    refused = {
        "org": "'org' is a folder of other models",
        "solo/x": "'solo' is a model: 'solo/x' cannot go inside its folder",
        "ORG/n": "'ORG/n' differs only in case from 'org'",
        "Solo": "'Solo' differs only in case from 'solo'",
    }
    for model_id, why in refused.items():
        with pytest.raises(BadRequest, match=why):
            folders.check_destination(models, model_id)
    for model_id in ("org/m", "org/n", "solo", "new", "new/m"):
        folders.check_destination(models, model_id)  # a model replaced, or a new name

    hub = StubHub({"config.json": b"{}"})
    with pytest.raises(BadRequest, match="'solo' is a model"):
        puller.pull(pull_target("solo/x"), models, hub, emit=lambda line: None)
    assert hub.fetched == [] and not (models / "solo" / "x").exists()
    built = tmp_path / "built"
    built.mkdir()
    with pytest.raises(BadRequest, match="folder of other models"):
        folders.place(built, models / "org")
    assert (models / "org" / "m" / "config.json").is_file()  # the org's models are still there


def test_a_file_larger_than_its_listing_stops_before_the_extra_bytes_land(tmp_path):
    models = tmp_path / "models"
    hub = StubHub({"config.json": b"{}", "model.safetensors": bytes(1000)})
    listed = hub.manifest

    def smaller(repo, revision):  # the listing says 500 bytes; 1000 come
        m = listed(repo, revision)
        files = tuple(RemoteFile(f.name, 500) if f.size == 1000 else f for f in m.files)
        return Manifest(m.repo, m.commit, files)

    hub.manifest = smaller
    with pytest.raises(BadGateway, match="model.safetensors of org/m is larger than"):
        _pull(hub, models)
    part = models / ".downloads" / "org--m" / "model.safetensors.part"
    assert part.stat().st_size <= 500 and not (models / "org").exists()
