"""The config tree: presets, TOML files, overrides, type checks, and the written round trip."""

import tomllib
from dataclasses import fields

import pytest

from fox_numba.config import (
    CHOICES,
    CONFIG_DOC_PATH,
    PRESETS,
    RUN_FIELDS_ADDED,
    SECTIONS,
    FoxConfig,
    config_table_markdown,
    field_help,
    load_config,
    load_run_config,
    to_toml,
    write_config,
)
from fox_numba.errors import ConfigError


def test_every_field_has_help_text():
    cfg = FoxConfig()
    for section in SECTIONS:
        for f in fields(getattr(cfg, section)):
            assert len(field_help(section, f.name)) > 10, f"{section}.{f.name} needs a help text"


def test_sections_are_the_stages():
    assert SECTIONS == ("market", "features", "folds", "env", "network", "learner", "evaluation", "run")


def test_smoke_preset_overrides_defaults():
    smoke, default = load_config("smoke"), load_config("default")
    assert smoke.learner.batch_size == PRESETS["smoke"]["learner.batch_size"] != default.learner.batch_size
    assert smoke.learner.gamma == default.learner.gamma  # not overridden: stays at the default


def test_file_then_overrides_apply_in_order(tmp_path):
    path = tmp_path / "cfg.toml"
    path.write_text("[learner]\nlr = 3e-4\ngamma = 0.95\n[env]\nn_envs = 8\n")
    cfg = load_config("smoke", path, ["learner.lr=5e-4", "market.store=/tmp/es.h5", "run.graphs=true"])
    assert cfg.learner.lr == 5e-4  # override wins over the file
    assert cfg.learner.gamma == 0.95  # file wins over the preset
    assert cfg.env.n_envs == 8
    assert cfg.market.store == "/tmp/es.h5"  # bare strings need no quotes
    assert cfg.run.graphs is True


def test_a_bare_date_sets_a_day_field(tmp_path):
    """`--set market.first_day=2024-07-15` (as the README writes it) and an unquoted date in a file: TOML reads
    both as dates; the day fields take them as their YYYY-MM-DD strings. A date-time stays an error."""
    path = tmp_path / "days.toml"
    path.write_text("[market]\nlast_day = 2024-09-30\n")
    cfg = load_config(path=path, overrides=["market.first_day=2024-07-15"])
    assert (cfg.market.first_day, cfg.market.last_day) == ("2024-07-15", "2024-09-30")
    with pytest.raises(ConfigError, match="market.first_day: expected str, got datetime"):
        load_config(overrides=["market.first_day=2024-07-15T09:30:00"])


def test_int_accepted_for_float_field():
    assert load_config(overrides=["learner.tau=1"]).learner.tau == 1.0


@pytest.mark.parametrize(
    "override, message",
    [
        ("learner.lr=abc", "expected float"),
        ("learner.batch_size=1.5", "expected int"),
        ("learner.batch_size=true", "expected int"),
        ("learner.nope=1", "has no field 'nope'"),
        ("nosection.x=1", "no section 'nosection'"),
        ("learner.lr", "not of the form"),
        ("learner.lr=nan", "not a finite number"),
        ('run.precision="fp16"', "run.precision: 'fp16' is not one of fp32, tf32, bf16"),
        ('learner.bootstrap="next"', "learner.bootstrap: 'next' is not one of direction, branch"),
        ('market.session="overnight"', "market.session: 'overnight' is not one of regular, full"),
    ],
)
def test_bad_overrides_are_refused_with_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[override])


def test_every_choice_field_defaults_to_a_choice_and_accepts_each():
    """CHOICES names real string fields; each default and each choice resolves; the modules acting on a field
    read its names from CHOICES (or, where they map names to values, hold exactly its names)."""
    from fox_numba.agent.evaluator import EVAL_NETWORKS
    from fox_numba.kernels.optim import WARMUP_RULES

    cfg = FoxConfig()
    for key, names in CHOICES.items():
        section, _, name = key.partition(".")
        assert getattr(getattr(cfg, section), name) in names
        for choice in names:
            assert getattr(getattr(load_config(overrides=[f'{key}="{choice}"']), section), name) == choice
    assert tuple(EVAL_NETWORKS) == CHOICES["evaluation.network"]
    assert tuple(WARMUP_RULES) == CHOICES["learner.warmup_rule"]


def test_bad_file_names_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[learner]\nlr = 'fast'\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: learner\.lr: expected float"):
        load_config(path=path)
    path.write_text("[learner\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path=path)
    with pytest.raises(ConfigError, match="not found"):
        load_config(path=tmp_path / "missing.toml")


def test_unreadable_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(path=tmp_path)  # a folder
    (tmp_path / "latin1.toml").write_bytes(b"[run]\nname = '\xe9'\n")
    with pytest.raises(ConfigError, match="latin1.toml: cannot read the config file"):
        load_config(path=tmp_path / "latin1.toml")


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        load_config("huge")


def test_written_config_reads_back_identically(tmp_path):
    cfg = load_config("smoke", overrides=['market.store="a \\"quoted\\" path.h5"', "learner.lr=1.25e-5"])
    cfg.run.name = "line\nbreak, tab\t, back\\slash, del\x7f, é"  # every character TOML makes us escape
    path = write_config(cfg, tmp_path / "run" / "config.toml")
    assert load_config("default", path) == cfg
    assert "# Adam base learning rate" in path.read_text()
    assert tomllib.loads(path.read_text())["learner"]["lr"] == 1.25e-5
    assert list(tmp_path.joinpath("run").iterdir()) == [path]  # no temporary file left behind


def test_a_run_config_without_a_later_field_keeps_the_value_its_run_used(tmp_path):
    """A run's config.toml written before a RUN_FIELDS_ADDED field existed (its line removed here) reads back with
    the value that run trained with, not today's default; a run that wrote the field keeps what it wrote."""
    cfg = load_config("default", overrides=["learner.lr=1.25e-5"])
    path = write_config(cfg, tmp_path / "config.toml")
    assert load_run_config(path) == cfg
    for key, value in RUN_FIELDS_ADDED.items():
        section, name = key.split(".")
        assert getattr(getattr(cfg, section), name) != value, f"{key}: the default changed, so the value differs"
        lines = path.read_text().splitlines()
        older = tmp_path / f"older_{name}.toml"
        older.write_text("\n".join(line for line in lines if not line.startswith(f"{name} = ")) + "\n")
        got = load_run_config(older)
        assert getattr(getattr(got, section), name) == value
        assert getattr(getattr(load_config("default", older), section), name) != value  # a plain config file: default
        assert got.learner.lr == 1.25e-5


def test_to_toml_covers_every_field():
    data = tomllib.loads(to_toml(FoxConfig()))
    cfg = FoxConfig()
    for section in SECTIONS:
        assert set(data[section]) == {f.name for f in fields(getattr(cfg, section))}


def test_committed_config_reference_is_current():
    assert CONFIG_DOC_PATH.read_text() == config_table_markdown(), (
        "fox_numba/CONFIG.md is stale: run python -m fox_numba.config --write"
    )
    for section in SECTIONS:
        for f in fields(getattr(FoxConfig(), section)):
            assert f"`{section}.{f.name}`" in CONFIG_DOC_PATH.read_text()
