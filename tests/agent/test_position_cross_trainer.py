"""network.position_cross through a real Trainer (with counterfactual targets from re-held positions at one
contract, the configuration it was built for): the learner's online network reads its s and s' observations beside
their position x market columns (a linear network, so the heads read them), the re-held transitions' s rows hold
their new positions, and training moves the head's crossed rows; the collect before it acts on the same wider input.
The network itself against float64: tests/agent/test_position_cross_network.py."""

import numpy as np
from real_trainer import SMALL, real_trainer

ON = ["network.n_layers=0", "network.position_cross=true", "learner.counterfactual=true",
      "learner.counterfactual_held=true", "env.fixed_bins=[0, 0, 0]"]


def test_a_trainer_reads_and_trains_the_crossed_columns(four_day_store):
    rt = real_trainer(four_day_store, [*SMALL, "learner.batch_size=8", "learner.steps_per_epoch=1", *ON])
    trainer, stager = rt.trainer, rt.trainer.stager
    lay, learner = trainer.layout, trainer.learner
    head = lay.entry("head.weight")
    trainer.collect()
    before = stager.download(learner.params)[head.offset : head.stop].reshape(head.shape)
    stats = trainer.train(lambda: None)
    assert np.isfinite(stats["loss"]) and stats["loss_direction"] > 0
    after = stager.download(learner.params)[head.offset : head.stop].reshape(head.shape)
    assert (after[lay.obs_dim :] != before[lay.obs_dim :]).any()  # the crossed rows train
    obs = stager.download(learner.obs)  # the last step's s rows, then its s' rows
    x = stager.download(learner.online.head_input(learner.online.batch))
    np.testing.assert_array_equal(x[:, : lay.obs_dim], obs)
    np.testing.assert_array_equal(x[:, lay.obs_dim :], obs[:, lay.position_col, None] * obs[:, : lay.cross])
    b = learner.batch.size
    transition = np.arange(b) // 4  # rows 4 i .. 4 i + 3 are transition i's directions
    reheld = transition % 4 != 0  # re-held at -1, 0, +1 contract (one Quarter of env.max_position = 4)
    np.testing.assert_array_equal(obs[:b, lay.position_col][reheld], ((transition % 4 - 2) / 4.0)[reheld])
