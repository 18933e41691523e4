"""The agent: its action space, and the stages (collector, learner, evaluator) around their kernels."""
