"""The stages (collector, learner, evaluator), each a small class around its kernels."""
