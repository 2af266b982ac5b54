"""`quill serve` hosts checkpoints by hub id from an offline Hugging Face cache (at the revision
--revision names), stops on the EOS ids of their generation_config.json, and gives each model its
chat template (the checkpoint's, or one from --chat-template)."""

from __future__ import annotations

import re
import shutil

import httpx
import pytest
import torch
import transformers

from quill.models.attention import default_attention_backend
from quill.models.text.chat_template import ChatTemplate
from quill.models.loading import location
from quill.models.loading.checkpoint import CheckpointError, load_checkpoint
from quill.models.loading.location import BUNDLED_DIR
from quill.models.text.tokenizer_config import read_tokenizer_config
from quill.server.api.app import create_app
from quill.server.config import DEFAULT_MODELS, ServerConfig, add_serve_arguments, config_from_args
from quill.server.engine.process.process_engine import ProcessEngine
from quill.server import hosting
from quill.server.hosting import ModelHost
from tests.conftest import TEST_DEVICE, LiveServer
from tests.hub_checkpoints import CHAT_MIN_TOKENS, CHAT_PROMPT, snapshot_dir, write_revisions

LLAMA, MISTRAL = "quill-test/tiny-llama-chat", "quill-test/tiny-mistral"


@pytest.fixture(scope="module")
def hub_server(hub_cache):
    cache, _ = hub_cache
    with LiveServer({}, "--model", LLAMA, "--model", f"mistral={MISTRAL}",
                        env={"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}) as server:
        yield server


def test_models_are_served_by_hub_id(hub_server):
    listed = httpx.get(f"{hub_server.url}/v1/models").json()["data"]
    assert [m["id"] for m in listed] == [LLAMA, "mistral"]


def test_greedy_completion_stops_on_a_generation_config_eos_id(hub_server, hub_cache):
    checkpoint = hub_cache[1][LLAMA]
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint.path)
    eos = transformers.GenerationConfig.from_pretrained(checkpoint.path).eos_token_id
    prompt_ids = tokenizer(CHAT_PROMPT).input_ids
    expected = checkpoint.reference.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=12,
                                             eos_token_id=eos, pad_token_id=0)[0, len(prompt_ids):].tolist()
    assert CHAT_MIN_TOKENS <= len(expected) < 12 and expected[-1] in eos and expected[-1] not in expected[:-1]
    # config.json's EOS is not it: only generation_config.json's longer list stops there.
    assert expected[-1] != transformers.AutoConfig.from_pretrained(checkpoint.path).eos_token_id
    body = httpx.post(f"{hub_server.url}/v1/completions", timeout=30, json={
        "model": LLAMA, "prompt": CHAT_PROMPT, "max_tokens": 12, "temperature": 0}).json()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["prompt_tokens"] == len(prompt_ids)  # BOS included, as the tokenizer declares
    assert body["usage"]["completion_tokens"] == len(expected)
    assert body["choices"][0]["text"] == tokenizer.decode(expected[:-1], skip_special_tokens=True)


def test_sliding_window_bounds_the_served_context(hub_server):
    too_long = httpx.post(f"{hub_server.url}/v1/completions", timeout=30, json={
        "model": "mistral", "prompt": "To be, or not to be " * 8, "max_tokens": 40})
    assert too_long.status_code == 400 and "48" in too_long.text


def test_load_log_names_the_generation_defaults(hub_server):
    logged = "sampling defaults from generation_config.json: temperature=0.6, top_p=0.9, max_tokens=64"
    assert logged in hub_server.output()


def test_load_log_says_how_many_tokens_the_cache_holds(hub_server, offline_hub):
    config = load_checkpoint(LLAMA, device="cpu").model.config
    per_token = 2 * config.n_layers * config.n_kv_heads * config.head_dim * 4  # K and V in float32
    backend = default_attention_backend(TEST_DEVICE)  # triton on CUDA; the CPU kernel where it builds
    # LiveServer reserves 4 MiB per model.
    assert f"({4 * 2**20 // per_token} tokens of K,V in blocks of 4, attention {backend})" in hub_server.output()


def parse(*argv: str) -> ServerConfig:
    import argparse

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


def test_generation_config_flag(monkeypatch):
    assert parse().generation_config == "auto"
    assert parse("--generation-config", "none").generation_config == "none"
    monkeypatch.setenv("QUILL_GENERATION_CONFIG", "none")
    assert parse().generation_config == "none"
    with pytest.raises(SystemExit):
        parse("--generation-config", "vllm")
    with pytest.raises(ValueError, match="generation_config must be one of"):
        ServerConfig(generation_config="sometimes")


def test_attention_backend_flag(monkeypatch):
    assert parse().attention_backend == "auto"
    assert parse("--attention-backend", "sdpa").attention_backend == "sdpa"
    monkeypatch.setenv("QUILL_ATTENTION_BACKEND", "triton")
    assert parse().attention_backend == "triton"
    with pytest.raises(SystemExit):
        parse("--attention-backend", "flash")


def test_engine_settings_follow_the_serve_flags():
    for argv, eager, overlap in (((), False, None), (("--enforce-eager", "--async-scheduling"), True, True),
                                 (("--no-async-scheduling",), False, False)):
        engine = ModelHost._host("gcnn", "shakespeare-gcnn", parse(*argv, "--max-num-seqs", "8"), (1, 1)).engine
        config = engine.config
        assert (config.enforce_eager, config.async_scheduling, config.scheduler.max_num_seqs) == (eager, overlap, 8)


def test_cache_size_flags(monkeypatch):
    assert (parse().cache_bytes, parse().gpu_memory_utilization) == (None, 0.9)  # sized from the GPU, or 256 MiB
    assert parse("--cache-bytes", "1024", "--gpu-memory-utilization", "0.5").cache_bytes == 1024
    monkeypatch.setenv("QUILL_GPU_MEMORY_UTILIZATION", "0.75")
    assert parse().gpu_memory_utilization == 0.75
    with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
        ServerConfig(gpu_memory_utilization=1.2)


def test_bare_hub_id_is_named_by_itself(tmp_path):
    config = ServerConfig(models=[LLAMA, str(tmp_path), "short=org/model"])
    assert config.model_specs() == [(LLAMA, LLAMA), (tmp_path.name, str(tmp_path)), ("short", "org/model")]


# ---- hub revisions -------------------------------------------------------------------------------

REVISIONS, TAG, MOVED = "quill-test/revisions", "2" * 40, "3" * 40


def test_revision_flag(monkeypatch, tmp_path):
    two_hub_ids = ("--model", LLAMA, "--model", f"mistral={MISTRAL}")
    assert parse(*two_hub_ids).model_revisions() == {}  # main, as before --revision
    config = parse(*two_hub_ids, "--revision", "v1", "--revision", "mistral=abc1234")
    assert config.model_revisions() == {LLAMA: "v1", "mistral": "abc1234"}  # a model's own beats the one for all
    assert parse("--model", LLAMA, "--model", str(tmp_path), "--revision", "v1").model_revisions() == {LLAMA: "v1"}
    monkeypatch.setenv("QUILL_REVISION", f"{LLAMA}=v2,mistral=pr/3")
    assert parse(*two_hub_ids).model_revisions() == {LLAMA: "v2", "mistral": "pr/3"}


def test_bad_revision_flags_stop_the_server_before_loading(tmp_path):
    hub_and_directory = [LLAMA, f"local={tmp_path}"]
    for models, revisions, words in (
        (hub_and_directory, ["gpt-9=v1"], f"no hosted model is named 'gpt-9' (hosted: {LLAMA}, local)"),
        (hub_and_directory, ["local=v1"], "the model 'local' is not a Hugging Face hub id, so it has no revisions"),
        ([str(tmp_path)], ["v1"], "no hosted model is a Hugging Face hub id, so none has revisions"),
        (hub_and_directory, ["v1", "v2"], "--revision given twice for every hub id"),
        (hub_and_directory, [f"{LLAMA}=v1", f"{LLAMA}=v2"], f"--revision given twice for {LLAMA}"),
        (hub_and_directory, ["../main"], "revision '../main' is not a branch, tag or commit name"),
    ):
        with pytest.raises(ValueError, match=re.escape(words)):
            ModelHost.load(ServerConfig(models=models, revisions=revisions, device="cpu"))


@pytest.fixture
def revision_cache(hub_cache, tmp_path, monkeypatch):
    """REVISIONS whose main names a snapshot the cache lacks and whose v1.0 names a good one: only a load
    that reads v1.0 succeeds."""
    cache = tmp_path / "hub"
    write_revisions(cache, REVISIONS, snapshot_dir(hub_cache[0], LLAMA), {TAG: 0.2}, {"main": "e" * 40, "v1.0": TAG})
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize("separate", [True, False])
async def test_a_model_is_served_at_its_revision(revision_cache, separate):
    """Both processes read the revision: the engine process's weights and this one's tokenizer and metadata
    (main would not load: see the next test)."""
    config = ServerConfig(models=[f"llama={REVISIONS}"], revisions=["llama=v1.0"], device=str(TEST_DEVICE),
                          dtype="float32", cache_bytes=2**20, engine_process=separate)
    host = ModelHost.load(config)
    try:
        loaded = host.models["llama"].loaded
        assert (loaded.model_id, loaded.revision, loaded.generation_defaults) == (REVISIONS, TAG, {"temperature": 0.2})
        app = create_app(host, config)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://quill.test") as c:
            info = (await c.get("/info")).json()
        assert (info["model_id"], info["model_sha"]) == (REVISIONS, TAG)
    finally:
        host.shutdown()


def test_a_branch_is_resolved_once_for_both_processes(hub_cache, tmp_path, monkeypatch):
    """With the engine in a process of its own, --revision v1.0 is looked up once and the engine process is
    handed that snapshot. v1.0 moves as soon as it has been looked up (here, or by the time the engine process
    has loaded): to a snapshot whose weights are missing and which recommends another temperature, so that
either process reading it would show."""
    cache = tmp_path / "hub"
    write_revisions(cache, REVISIONS, snapshot_dir(hub_cache[0], LLAMA), {TAG: 0.2, MOVED: 0.7}, {"v1.0": TAG})
    for shard in snapshot_dir(cache, REVISIONS, MOVED).glob("model-*.safetensors"):
        shard.unlink()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ref = snapshot_dir(cache, REVISIONS).parent.parent / "refs" / "v1.0"
    looked_up, started = location.hub_snapshot, ProcessEngine.start

    def look_up_then_move(*args, **kwargs):
        try:
            return looked_up(*args, **kwargs)
        finally:
            ref.write_text(MOVED)

    def start_then_move(self, *args, **kwargs):
        started(self, *args, **kwargs)
        ref.write_text(MOVED)

    monkeypatch.setattr(location, "hub_snapshot", look_up_then_move)
    monkeypatch.setattr(ProcessEngine, "start", start_then_move)
    host = ModelHost.load(ServerConfig(models=[f"llama={REVISIONS}"], revisions=["llama=v1.0"], device=str(TEST_DEVICE),
                                       dtype="float32", cache_bytes=2**20, engine_process=True))
    try:
        hosted = host.models["llama"]
        assert (hosted.loaded.revision, hosted.loaded.generation_defaults) == (TAG, {"temperature": 0.2})
        assert hosted.engine.spec.path.revision == TAG and hosted.engine.is_alive
    finally:
        host.shutdown()
    assert ref.read_text() == MOVED


def test_without_a_revision_main_is_read(revision_cache):
    with pytest.raises(CheckpointError, match=re.escape(f"revision main of {REVISIONS} is not in the Hugging Face "
                                                        "cache (cached revisions: main (eeeeeeeeeeee, its snapshot "
                                                        "missing), v1.0 (222222222222))")):
        ModelHost.load(ServerConfig(models=[REVISIONS], device="cpu", engine_process=False))


# ---- chat templates ------------------------------------------------------------------------------

TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
ONE_TURN = [{"role": "user", "content": "To be"}]


def test_chat_template_flag(monkeypatch):
    assert parse().chat_template_files() == {}
    config = parse("--chat-template", "all.jinja", "--chat-template", "tiny=tiny.jinja")
    assert config.chat_template_files() == {None: "all.jinja", "tiny": "tiny.jinja"}
    monkeypatch.setenv("QUILL_CHAT_TEMPLATE", "a.jinja,b=b.jinja")
    assert parse().chat_template_files() == {None: "a.jinja", "b": "b.jinja"}
    with pytest.raises(ValueError, match="given twice for every model"):
        ServerConfig(chat_templates=["a.jinja", "b.jinja"]).chat_template_files()


def host_tiny(tiny_checkpoints, **overrides) -> ModelHost:
    """The tiny checkpoints (which ship no chat template), loaded but not started."""
    return ModelHost.load(ServerConfig(models=[f"{n}={p}" for n, p in tiny_checkpoints.items()], device="cpu",
                                       dtype="float32", cache_bytes=2**20, **overrides))


def test_chat_template_file_serves_models_without_one(tiny_checkpoints, tmp_path):
    (tmp_path / "chat.jinja").write_text(TEMPLATE)
    (tmp_path / "lstm.jinja").write_text("[{{ messages[-1].content }}]")
    host = host_tiny(tiny_checkpoints, chat_templates=[str(tmp_path / "chat.jinja"),
                                                       f"tiny-lstm={tmp_path / 'lstm.jinja'}"])
    assert host.models["tiny-transformer"].chat_template.render(ONE_TURN) == "<user>To be<assistant>"
    assert host.models["tiny-lstm"].chat_template.render(ONE_TURN) == "[To be]"  # its own beats the one for all
    without = host_tiny(tiny_checkpoints).models["tiny-gcnn"]
    assert without.chat_template is None
    assert "has no chat template" in without.no_chat_reason and "--chat-template FILE" in without.no_chat_reason


def test_bad_chat_template_files_stop_the_server_before_loading(tiny_checkpoints, tmp_path):
    (tmp_path / "broken.jinja").write_text("{% for m in messages %}")
    (tmp_path / "good.jinja").write_text(TEMPLATE)
    for spec, words in ((str(tmp_path / "broken.jinja"), "does not compile"),
                        (str(tmp_path / "missing.jinja"), "No such file"),
                        (f"nope={tmp_path / 'good.jinja'}", "not hosted: nope")):
        with pytest.raises(ValueError, match=words):
            host_tiny(tiny_checkpoints, chat_templates=[spec])


def test_a_checkpoint_template_that_does_not_compile_disables_only_chat(tiny_checkpoints, tmp_path):
    directory = tmp_path / "broken-template"
    shutil.copytree(tiny_checkpoints["tiny-lstm"], directory)
    (directory / "chat_template.jinja").write_text("{% if %}")
    hosted = host_tiny({"broken": str(directory)}).models["broken"]
    assert hosted.chat_template is None and "cannot be used" in hosted.no_chat_reason


def test_bundled_language_models_ship_one_documented_chat_template():
    """The language models chat as a scene of a play; the restoration models (encoder-decoders, a line in and the
    line restored out) have no chat."""
    restorers = [name for name in DEFAULT_MODELS if (BUNDLED_DIR / name / "toolkit_tokenizer.json").is_file()]
    language_models = [name for name in DEFAULT_MODELS if name not in restorers]
    assert len(language_models) == 4 and len(restorers) == 3
    sources = {name: (BUNDLED_DIR / name / "chat_template.jinja").read_text() for name in language_models}
    assert len(set(sources.values())) == 1  # the same scene-of-a-play template for all of them
    source = sources[DEFAULT_MODELS[0]]
    assert source.startswith("{#-") and "USER" in source  # it says what it does, in a comment
    for name in language_models:
        assert read_tokenizer_config(BUNDLED_DIR / name).chat_template == source  # what the loader picks up
    for name in restorers:
        assert read_tokenizer_config(BUNDLED_DIR / name).chat_template is None
    assert ChatTemplate(source).render(ONE_TURN) == "USER.\nTo be\n\nQUILL.\n"


def test_engine_process_flag(monkeypatch):
    assert parse().engine_process is None  # decided per device and thread count (uses_engine_process)
    assert parse("--engine-process").engine_process is True
    assert parse("--no-engine-process").engine_process is False
    monkeypatch.setenv("QUILL_ENGINE_PROCESS", "0")
    assert parse().engine_process is False


def test_a_cpu_engine_runs_in_a_process_where_its_threads_leave_a_core_free(monkeypatch):
    monkeypatch.setattr(hosting, "available_cores", lambda: 2)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as benchmarks start servers: it bounds the compute threads only
    cpu = dict(models=["m"], device="cpu")
    assert hosting.uses_engine_process(ServerConfig(**cpu, threads=1))  # the HTTP side gets the other core
    assert not hosting.uses_engine_process(ServerConfig(**cpu, threads=2))  # steps on both cores: a thread
    assert not hosting.uses_engine_process(ServerConfig(**cpu, threads="auto"))
    assert not hosting.uses_engine_process(ServerConfig(**cpu, threads=1, engine_process=False))  # the flag rules
    monkeypatch.setattr(hosting, "available_cores", lambda: 1)
    assert not hosting.uses_engine_process(ServerConfig(**cpu, threads=1))


@pytest.mark.parametrize("separate", [True, False])
def test_engine_processes_load_the_weights_and_share_the_gpu_fraction(tiny_checkpoints, separate):
    models = [f"{name}={tiny_checkpoints[name]}" for name in ("tiny-lstm", "tiny-gcnn")]
    host = ModelHost.load(ServerConfig(models=models, device=str(TEST_DEVICE), dtype="float32",
                                       gpu_memory_utilization=0.8, engine_process=separate))
    try:
        shares = [m.engine.config.cache.gpu_memory_utilization for m in host.models.values()]
        devices = {p.device.type for m in host.models.values() for p in m.loaded.model.parameters()}
        assert host.all_alive is separate  # a process runs once loaded; a thread waits for start()
    finally:
        host.shutdown()
    # Each engine process sees the earlier ones' memory as taken: its budget is the shares up to its own.
    assert shares == ([0.4, 0.8] if separate else [0.4, 0.4])
    assert devices == ({"meta"} if separate else {TEST_DEVICE.type})  # the server never loads them twice
