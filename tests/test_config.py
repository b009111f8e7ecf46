"""Resolving a run's config once (lra/config.py): every config composes, attention options are
typed config nodes for every backend, and a bad value is one line before any work starts."""

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import attention
import lra.checks
import lra.config
import lra.tasks
from lra import CONF_DIR
from lra.config import ConfigError, DataSpec, attn_configs, compose, load
from lra.tags import flat
from lra.tasks import TASK_SPECS, ImageSpec, ListOpsSpec, PathfinderSpec, RetrievalSpec, TextSpec, task_spec

NAMES = attention.available()


@pytest.mark.parametrize("group", ["task", "preset", "hardware", "logger", "model", "trainer"])
def test_every_config_file_composes_and_resolves(group, tmp_path):
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        overrides = [f"{group}={path.stem}", f"runs_root={tmp_path}"]
        cfg = compose(overrides)
        spec = load(overrides)  # a task node is typed and checked without its data (lra/tasks.py)
        assert spec.config["preset"] == cfg.preset


@pytest.mark.parametrize("name", attn_configs())
def test_every_attention_config_resolves_under_every_preset(name):
    for preset in ("skeinformer_paper", "skyformer_paper", "nystromformer_paper", "quick"):
        spec = load([f"attn={name}", f"preset={preset}"])
        assert spec.attn.label == name and set(spec.attn.options) == set(attention.option_defaults(spec.attn.name))


def _bad_value(info: dict):
    """A value outside what the option's checks allow (None where its range says nothing)."""
    rng = info["range"]
    if rng.startswith("one of"):
        return "not_a_choice" if info["type"] == "str" else None
    if rng.startswith(("integer [", "[")):
        lo = rng.split("[", 1)[1].split(",")[0]
        return None if lo == "-inf" else (int(float(lo)) - 1 if rng.startswith("integer") else float(lo) - 1.0)
    if rng.startswith(("integer (", "(")):
        lo = rng.split("(", 1)[1].split(",")[0]
        return None if lo == "-inf" else (int(float(lo)) if rng.startswith("integer") else float(lo))
    return None


@pytest.mark.parametrize("name", NAMES)
def test_attention_options_without_plus_typed_and_range_checked(name):
    info = attention.option_info(name)
    with pytest.raises(ConfigError, match=rf"attn.options.no_such_option.*{name}"):
        load([f"attn={name}", "preset=quick", "attn.options.no_such_option=1"])
    if not info:
        assert attention.option_defaults(name) == {}, name  # none, vmean: nothing to set
        return
    opt, spec_info = next(iter(info.items()))
    default = spec_info["default"]
    spec = load([f"attn={name}", "preset=quick", f"attn.options.{opt}={'null' if default is None else default}"])
    assert spec.attn.options[opt] == default
    checked = [(o, _bad_value(i)) for o, i in info.items() if _bad_value(i) is not None]
    assert checked or name in ("softmax_nodrop",), f"{name}: no option with a checked range"
    for o, bad in checked[:2]:
        with pytest.raises(ConfigError, match=rf"'{o}'={bad!r}"):
            load([f"attn={name}", "preset=quick", f"attn.options.{o}={bad}"])


def test_option_precedence_backend_variant_preset_task_command_line():
    # registry default < variant base_options < preset attn_options < command line
    assert load(["attn=softmax", "preset=quick"]).attn.options == {"dropout": 0.1, "impl": "fused", "causal": False}
    assert load(["attn=softmax_nodrop", "preset=quick"]).attn.options["dropout"] == 0.0
    paper = load(["attn=softmax_nodrop", "preset=skeinformer_paper"]).attn
    assert paper.options["impl"] == "materialized" and paper.preset_options == {"impl": "materialized"}
    cli = load(
        ["attn=softmax_nodrop", "preset=skeinformer_paper", "attn.options.impl=fused", "attn.options.dropout=0.2"]
    ).attn
    assert (cli.options["impl"], cli.options["dropout"], cli.preset_options) == ("fused", 0.2, {})
    # the protocol file's attn_options beat the preset-wide table (the Nyströmformer preset's YOSO hash bits)
    assert load(["attn=yoso", "preset=nystromformer_paper", "task=image"]).attn.options["hash_bits"] == 10


def test_describe_shows_type_default_range_and_meaning():
    for name in NAMES:  # every option of every backend says what it means (the comment on its field)
        assert all(i["doc"] and i["type"] for i in attention.option_info(name).values()), name
    text = str(attention.describe("skeinformer"))
    assert "num_features: int = 256  integer [1, inf)" in text and "pilot rows" in text
    assert attention.describe("skeinformer")["options"]["num_features"] == 256  # still a dict for programs


@pytest.mark.parametrize(
    "override,key",
    [
        ("seed=1.5", "seed=1.5"),
        ("train.max_steps=0", "train.max_steps=0"),
        ("train.eval_every=0", "train.eval_every=0"),
        ("train.batch_size=0", "train.batch_size=0"),
        ("train.test_ckpt=middle", "train.test_ckpt='middle'"),
        ("+task.path=/nonexistent/listops", "task.path='/nonexistent/listops'"),
        ("trainer.num_workers=-1", "trainer.num_workers=-1"),
        ("+train.bogus=1", "train.bogus"),
        ("trainer.precision=fp8", "trainer.precision='fp8'"),
        ("attn.options.impl=flash", "'impl'='flash'"),
        ("hardware.micro_batch=5", "hardware.micro_batch=5"),
        # a string is no boolean: bool("no") is True, and force=true retrains a finished run
        ("force=no", "force='no'"),
        ("force=off", "force='off'"),
        ("trainer.progress=maybe", "trainer.progress='maybe'"),
        ("trainer.deterministic=flase", "trainer.deterministic='flase'"),
        # numbers that cannot run (NaN passes every comparison; a huge seed failed in numpy after the folder existed)
        ("train.lr=inf", "train.lr=inf is not allowed: a finite number >= 0.0"),
        ("train.lr=nan", "train.lr=nan is not allowed"),
        ("train.weight_decay=nan", "train.weight_decay=nan is not allowed"),
        ("train.select_after=-inf", "train.select_after=-inf is not allowed"),
        ("seed=99999999999999999999", "seed=99999999999999999999 is not allowed: an integer in [0, 4294967295]"),
        ("attn=external", "attn.target is missing: attn=external needs"),
        # every boolean is strict, every count an integer in range (bool('no') is True; n_train=-3 crashes late)
        ("task.generate=no", "task.generate='no' is not allowed: true or false"),
        ("fit.cache=maybe", "fit.cache='maybe' is not allowed: true or false"),
        ("task.generator.n_train=-3", "task.generator.n_train=-3 is not allowed: an integer >= 1"),
        # a protocol value has one key: the old relay spelling names it
        ("protocol.data.n_train=256", "protocol.data.n_train= is now task.generator.n_train= (one key per value)"),
        ("+protocol.data.dev_split=test", "protocol.data.dev_split= is now task.dev_split="),
        ("protocol.lr=1e-3", "protocol.lr= is now train.lr= (one key per value): use train.lr=1e-3"),
        ("trainer.log_every_n_steps=abc", "trainer.log_every_n_steps='abc' is not allowed"),
    ],
)
def test_bad_values_are_one_line_naming_key_and_value(override, key):
    with pytest.raises(ConfigError) as e:
        load(["preset=quick", override])
    assert key in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow  # ~19 s of a subprocess run: in `make test-slow`, which CI runs, so `make test` stays under 12 min
def test_train_refuses_bad_input_before_any_folder_exists(tmp_path):
    env = {**os.environ, "LRA_DATA": str(tmp_path / "data"), "LRA_RUNS": str(tmp_path / "runs"), "OMP_NUM_THREADS": "1"}
    for bad in ("seed=1.5", "attn=skeinformer attn.options.num_features=0", "attn=linformer attn.options.nope=3"):
        proc = subprocess.run(
            [sys.executable, "-m", "lra.train", "preset=quick", *bad.split()],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        err = proc.stderr.strip()
        assert proc.returncode == 2 and err.startswith("error: ") and len(err.splitlines()) == 1, err
        assert "Traceback" not in proc.stdout + proc.stderr
        assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()


def test_fit_cli_takes_options_without_plus_and_rejects_bad_ones(tmp_path):
    env = {**os.environ, "LRA_RUNS": str(tmp_path), "OMP_NUM_THREADS": "1"}

    def fit(*args):
        return subprocess.run(
            [sys.executable, "-m", "lra.fit", "task=listops", "preset=quick", "hardware=cpu", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    ok = fit("attn=nystrom", "attn.options.landmarks=16")
    assert ok.returncode == 0 and "'landmarks': 16" in ok.stdout, ok.stderr
    unknown = fit("attn=nystrom", "attn.options.landmark=16")
    assert unknown.returncode == 2 and "attn.options.landmark" in unknown.stderr and "landmarks" in unknown.stderr
    out_of_range = fit("attn=nystrom", "attn.options.landmarks=0")
    assert out_of_range.returncode == 2 and "'landmarks'=0" in out_of_range.stderr


# --------------------------------------------------------------------------------------------
# Task nodes: typed specs (lra/tasks.py), checked when the config is resolved


@pytest.mark.parametrize("task", sorted(TASK_SPECS))
def test_task_spec_defaults_are_the_task_files_defaults(task):
    """A spec built in code (tests, notebooks) is what conf/task/<task>.yaml gives without a preset's data keys."""
    cfg = compose([f"task={task}", "preset=quick", "~protocol"])
    spec = task_spec(OmegaConf.to_container(cfg.task, resolve=True))
    assert type(spec) is TASK_SPECS[task] and spec == TASK_SPECS[task]()


def test_resolved_data_spec_is_typed_and_keeps_the_node_it_hashes():
    spec = load(["preset=quick", "task=listops"])
    assert isinstance(spec.data.spec, ListOpsSpec) and spec.data.spec.generator.n_train == 20000
    assert spec.data.options == spec.config["task"]  # the resume key and the loaded-data key hash the node as composed
    built = DataSpec(task="text", root=Path("/tmp"), spec=TextSpec(max_length=512, seq_len=512))
    assert built.options == dataclasses.asdict(built.spec) and built.options["max_length"] == 512


@pytest.mark.parametrize(
    "override,message",
    [
        (
            "+task.tokenzier=alnum",
            "task.tokenzier='alnum' is not allowed: not a key of task; valid keys: dirname, dual, "
            "generate, generator, max_examples, max_length, name, num_classes, path, seq_len, "
            "tokenizer, vocab_size",
        ),
        (
            "+task.generator.n_trian=5",
            "task.generator.n_trian=5 is not allowed: not a key of task.generator; valid keys: "
            "max_args, max_depth, max_length, min_length, n_test, n_train, n_val, seed",
        ),
        (
            "+task.max_examples.dev=3",
            "task.max_examples.dev=3 is not allowed: not a key of task.max_examples; valid keys: " "test, train, val",
        ),
    ],
)
def test_a_typo_in_a_task_key_is_one_line_naming_the_valid_keys(override, message):
    with pytest.raises(ConfigError) as e:
        load(["preset=quick", "task=listops", override])
    assert str(e.value) == message


@pytest.mark.parametrize(
    "overrides,message",
    [
        ("task=listops task.tokenizer=words", "task.tokenizer='words' is not allowed: one of brackets, alnum"),
        ("task=listops task.max_length=abc", "task.max_length='abc' is not allowed: an integer >= 1 or null"),
        ("task=listops task.generator.max_depth=1", "task.generator.max_depth=1 is not allowed: an integer >= 2"),
        (
            "task=listops task.generator.min_length=119",
            "task.generator.min_length=119 is not allowed: an integer below",
        ),
        ("task=text task.dev_split=dev", "task.dev_split='dev' is not allowed: one of carve, test"),
        ("task=text task.val_fraction=1.0", "task.val_fraction=1.0 is not allowed: a finite number in (0.0, 1.0)"),
        ("task=text task.split_seed=-1", "task.split_seed=-1 is not allowed: an integer in [0, 4294967295]"),
        ("task=retrieval task.download=maybe", "task.download='maybe' is not allowed: true or false"),
        ("task=retrieval task.dual=false", "task.dual=False is not allowed: true for task retrieval"),
        ("task=image task.grayscale=rgb", "task.grayscale='rgb' is not allowed: one of luminance, tf"),
        ("task=image task.mask=zero", "task.mask='zero' is not allowed: one of all, nonzero"),
        (
            "task=pathfinder task.difficulty=medium",
            "task.difficulty='medium' is not allowed: one of easy, intermediate",
        ),
        (
            "task=pathfinder task.seq_len=4096",
            "task.seq_len=4096 is not allowed: 1024, the pixels of pathfinder32 images",
        ),
        ("task=pathfinder task.n_images=0", "task.n_images=0 is not allowed: an integer >= 1 or null"),
        ("task=pathfinder task.generator.chunk=0", "task.generator.chunk=0 is not allowed: an integer >= 1"),
        (
            "task=pathfinder task.max_examples={val:0}",
            "task.max_examples.val=0 is not allowed: an integer >= 1 or null",
        ),
    ],
)
def test_each_task_spec_checks_its_values_when_the_config_is_resolved(overrides, message):
    with pytest.raises(ConfigError) as e:
        load(["preset=quick", *overrides.split()])
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "cls,bad",
    [
        (ListOpsSpec, {"generate": "yes"}),
        (TextSpec, {"max_length": 4000.0}),
        (RetrievalSpec, {"seq_len": "4096"}),
        (ImageSpec, {"val_fraction": "0.1"}),
        (PathfinderSpec, {"resolution": 48}),
        (ListOpsSpec, {"name": "text"}),
        (ListOpsSpec, {"generator": {"seed": 0}}),  # a nested node is its dataclass (task_spec builds it from a dict)
    ],
)
def test_a_spec_built_in_code_is_type_checked_too(cls, bad):
    with pytest.raises(ConfigError, match=f"task.{next(iter(bad))}="):
        cls(**bad)


def test_the_config_layer_owns_config_error_and_the_task_specs():
    assert lra.config.ConfigError is lra.checks.ConfigError is lra.tasks.ConfigError
    assert sorted(TASK_SPECS) == ["image", "listops", "pathfinder", "retrieval", "text"]
    with pytest.raises(ConfigError, match="task.name='mnist' is not allowed: one of image, listops, pathfinder"):
        task_spec({"name": "mnist"})


@pytest.mark.parametrize(
    "override,node,some_key",
    [
        ("task.tokenzier=x", "task", "tokenizer"),
        ("train.lrr=1", "train", "lr"),
        ("model.dropuot=0.2", "model", "dropout"),
    ],
)
def test_a_typo_in_a_key_lists_the_keys_of_its_node(override, node, some_key):
    """Hydra's own refusal ("Key ... is not in struct") says only what is wrong; the line also says what is right."""
    with pytest.raises(ConfigError) as e:
        load(["preset=quick", "task=listops", override])
    line = str(e.value)
    assert "\n" not in line and line.startswith(override.split("=")[0]) and f"{node} has the keys" in line
    assert some_key in [k.strip() for k in line.split("has the keys", 1)[1].split(",")]


# ---------------------------------------------------------------------------------------------
# One word per idea: preset=, quirks=, one protocol file per (preset, task)


@pytest.mark.parametrize(
    "old, says",
    [
        (["experiment=quick"], "experiment= is now preset=: use preset=quick"),
        (["task=text", "+experiment=skyformer_paper"], "experiment= is now preset=: use preset=skyformer_paper"),
        (["semantics=clean"], "semantics= is now quirks=: use quirks=none"),
        (["semantics=paper"], "semantics= is now quirks=: use quirks=skeinformer"),
        (["preset=skyformer_paper", "semantics=paper"], "use quirks=skyformer"),
        (["preset=quick", "semantics=paper"], "quirks=skeinformer|skyformer|nystromformer"),
    ],
)
def test_old_spellings_fail_with_one_line_naming_the_new_one(old, says):
    with pytest.raises(ConfigError) as e:
        load(old)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_quirks_is_the_one_semantics_knob():
    paper, clean = load(["task=listops"]), load(["task=listops", "quirks=none"])
    assert (paper.semantics, clean.semantics) == ("paper", "clean")
    assert paper.config["semantics"] == "paper" and clean.config["semantics"] == "clean"
    assert load(["preset=quick", "quirks=skyformer"]).semantics == "paper"


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONF_DIR / "preset").glob("*.yaml")))
def test_a_preset_is_named_by_its_file_and_reads_its_protocol_file(preset):
    for task in ("listops", "text", "retrieval", "image", "pathfinder"):
        cfg = compose([f"preset={preset}", f"task={task}"])
        assert cfg.preset == preset  # the run folder's and record's preset: the file's name
        own = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "protocol" / preset / f"{task}.yaml"))
        assert set(own) <= {"train", "task", "attn_options"}  # the run's own keys, one per value
        for key, value in flat(own).items():  # each as the file writes it (a map merges into the task's own)
            assert OmegaConf.select(cfg, key) == value, (task, key)


@pytest.mark.parametrize("code", sorted(p.stem for p in (CONF_DIR / "quirks").glob("*.yaml")))
def test_code_quirks_reads_what_hydra_composes(code):
    from lra.config import code_quirks

    composed = compose([f"quirks={code}"]).quirks
    assert code_quirks(code) == (OmegaConf.to_container(composed) if composed else {})


def test_the_preset_task_protocol_file_is_what_a_run_reads(tmp_path):
    """Editing conf/protocol/<preset>/<task>.yaml (in a copy of conf/) changes that run, and only it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    path = conf / "protocol" / "quick" / "listops.yaml"
    path.write_text(path.read_text().replace("batch_size: 32", "batch_size: 48").replace("lr: 1.0e-3", "lr: 3.0e-3"))

    def train(*overrides):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=list(overrides)).train

    edited, other = train("preset=quick", "task=listops"), train("preset=quick", "task=text")
    assert (edited.batch_size, edited.lr) == (48, 3e-3)
    assert (other.batch_size, other.lr) == (compose(["preset=quick", "task=text"]).train.batch_size, 1e-3)
