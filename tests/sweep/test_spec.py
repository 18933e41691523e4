"""The sweep spec: trials are the grid's cartesian product times the seeds; bad input names file and key."""

import pytest

from fox_numba.errors import ConfigError
from fox_numba.sweep.spec import load_spec


def spec_file(tmp_path, text):
    path = tmp_path / "spec.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_trials_are_the_product_of_the_grid_times_the_seeds(tmp_path):
    spec = load_spec(spec_file(tmp_path, """
[sweep]
seeds = [3, 1]
[grid]
"learner.lr" = [1e-4, 3e-4]
network = { hidden = [8, 16, 32] }
"""))
    trials = spec.trials()
    assert [t.id for t in trials] == [f"c{c:02d}-seed{s}" for c in range(6) for s in (3, 1)]
    assert [dict(t.values) for t in trials[::2]] == [
        {"learner.lr": lr, "network.hidden": h} for lr in (1e-4, 3e-4) for h in (8, 16, 32)
    ]
    assert trials[3].overrides() == ["learner.lr=0.0001", "network.hidden=16"] and trials[3].seed == 1
    assert isinstance(dict(trials[0].values)["learner.lr"], float)


def test_seeds_alone_sweep_the_base_config(tmp_path):
    spec = load_spec(spec_file(tmp_path, "[sweep]\nseeds = [0, 1]\n"))
    assert [(t.id, t.values) for t in spec.trials()] == [("c00-seed0", ()), ("c00-seed1", ())]


def test_list_fields_take_lists_of_lists(tmp_path):
    text = '[sweep]\nseeds = [0]\n[grid]\n"learner.branch_weights" = [[1, 1, 1, 1], [2, 1, 1, 1]]\n'
    spec = load_spec(spec_file(tmp_path, text))
    assert spec.trials()[1].overrides() == ["learner.branch_weights=[2.0, 1.0, 1.0, 1.0]"]


@pytest.mark.parametrize(("text", "words"), [
    ('[sweep]\nseeds = [0]\n[grid]\n"learner.lrr" = [1e-4]\n', ["grid.learner.lrr", "has no field 'lrr'"]),
    ('[sweep]\nseeds = [0]\n[grid]\n"lerner.lr" = [1e-4]\n', ["grid.lerner.lr", "no config field"]),
    ('[sweep]\nseeds = [0]\n[grid.learner]\nlr = [1e-4, "fast"]\n', ["grid.learner.lr[1]", "expected float", "'fast'"]),
    ('[sweep]\nseeds = [0]\n[grid]\n"network.hidden" = [8.5]\n', ["grid.network.hidden[0]", "expected int"]),
    ('[sweep]\nseeds = [0]\n[grid]\n"learner.lr" = []\n', ["grid.learner.lr", "empty"]),
    ('[sweep]\nseeds = [0]\n[grid]\n"learner.lr" = 1e-4\n', ["grid.learner.lr", "expected a list"]),
    ('[sweep]\nseeds = [0]\n[grid]\n"learner.lr" = [1e-4, 1e-4]\n', ["grid.learner.lr[1]", "twice"]),
    ('[sweep]\nseeds = [0]\n[grid]\n"run.seed" = [1, 2]\n', ["grid.run.seed", "set by the sweep"]),
    ('[sweep]\nseeds = []\n', ["sweep.seeds", "empty"]),
    ('[sweep]\nseeds = [0, true]\n', ["sweep.seeds[1]", "expected int"]),
    ('[sweep]\nseeds = [0]\nrepeats = 2\n', ["sweep.repeats", "unknown key"]),
    ('[grid]\n"learner.lr" = [1e-4]\n', ["[sweep] seeds is missing"]),
    ('[sweep]\nseeds = [0]\n[grids]\n', ["unknown table 'grids'"]),
    ('[sweep]\nseeds = [0\n', ["not valid TOML"]),
])
def test_bad_specs_name_the_file_and_the_key(tmp_path, text, words):
    path = spec_file(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_spec(path)
    message = str(err.value)
    assert message.startswith(str(path)), message
    for word in words:
        assert word in message, message


def test_a_missing_spec_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nope.toml: sweep spec not found"):
        load_spec(tmp_path / "nope.toml")


def test_without_ray_the_command_says_how_to_install_it(tmp_path):
    """`fox sweep` exits 2 with the install command when ray cannot be imported (blocked here)."""
    import subprocess
    import sys

    path = spec_file(tmp_path, "[sweep]\nseeds = [0]\n")
    code = ("import sys; sys.modules['ray'] = None; sys.argv = ['fox', 'sweep', sys.argv[1]]; "
            "from fox_numba.cli import main; main()")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert 'fox sweep needs Ray: pip install -e ".[ray]"' in proc.stderr
