"""fox_numba/sweep/runner.py's GPU request: `fox sweep --per-gpu N` grants each trial 1/N of a GPU on a cluster
with GPUs (and none under the simulator), through a stand-in `ray` that records what the runner asked of it, so
no GPU and no cluster are needed; the options' refusals through the command line."""

import types

import pytest
from typer.testing import CliRunner

from fox_numba.cli import app
from fox_numba.device.runtime import SIMULATOR
from fox_numba.sweep import runner
from fox_numba.sweep.folder import SweepFolder


class FakeRay(types.SimpleNamespace):
    """Ray's calls the runner makes: init, cluster_resources, remote(...).options(...).remote(...), wait, get,
    shutdown; each task "runs" at once, returning a finished trial."""

    def __init__(self, gpus: int) -> None:
        super().__init__(gpus=gpus, options=None, submitted=[], refs={})

    def init(self, **kwargs) -> None:
        pass

    def cluster_resources(self) -> dict:
        return {"CPU": 2.0, "GPU": float(self.gpus)} if self.gpus else {"CPU": 2.0}

    def remote(self, fn):
        ray = self

        class Task:
            def options(self, **kwargs):
                ray.options = kwargs
                return self

            def remote(self, job, use_gpu):
                ref = object()
                ray.submitted.append((job.id, use_gpu))
                ray.refs[ref] = {"returncode": 0, "resumed": False, "wall_s": 1.0, "error": None}
                return ref

        return Task()

    def wait(self, refs, num_returns, timeout):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        return self.refs[ref]

    def shutdown(self) -> None:
        pass


def jobs(tmp_path, n):
    return [runner.TrialJob(id=f"c00-seed{k}", train_args=(), run_dir=str(tmp_path / f"r{k}"),
                            stdout=str(tmp_path / f"{k}.out"), stderr=str(tmp_path / f"{k}.err"), cwd=str(tmp_path))
            for k in range(n)]


@pytest.mark.parametrize("gpus, per_gpu, expected", [(1, 1, 1.0), (1, 8, 0.125), (2, 3, 1 / 3), (0, 8, 0)])
def test_each_trial_asks_for_its_share_of_a_gpu(tmp_path, monkeypatch, gpus, per_gpu, expected):
    fake = FakeRay(gpus)
    monkeypatch.setattr(runner, "import_ray", lambda: fake)
    folder = SweepFolder(tmp_path / "sweep")
    done = []
    runner.run_jobs(jobs(tmp_path, 3), folder, address=None, simulator=gpus == 0, per_gpu=per_gpu,
                    on_done=lambda job, record, resumed: done.append((job.id, record.returncode)))
    assert fake.options == {"num_gpus": expected, "num_cpus": 1, "max_retries": 0}
    assert fake.submitted == [(f"c00-seed{k}", gpus > 0) for k in range(3)]
    assert sorted(done) == [(f"c00-seed{k}", 0) for k in range(3)]


cli = CliRunner()


@pytest.mark.parametrize("extra, message", [
    (["--mps", "--address", "auto"], "with --address, start one on each node instead"),
    (["--per-gpu", "0"], "--per-gpu"),
    pytest.param(["--mps"], "there is none here (the CUDA simulator is on)",
                 marks=pytest.mark.skipif(not SIMULATOR, reason="on a GPU, --mps would run the sweep")),
])
def test_the_sharing_options_refuse_what_cannot_work(tmp_path, monkeypatch, extra, message):
    """Refused before Ray is asked for: the same message with or without the extra installed."""
    def no_ray():
        raise runner.RayMissing(runner.RAY_MISSING)
    monkeypatch.setattr(runner, "import_ray", no_ray)
    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\nseeds = [0]\n[grid]\n"learner.lr" = [3e-4]\n')
    result = cli.invoke(app, ["sweep", str(spec), *extra])
    assert result.exit_code != 0
    assert message in " ".join((result.output + str(result.exception)).split())
