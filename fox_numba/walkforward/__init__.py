"""Walk-forward validation: the host-side machinery the fold driver calls.

folds.py (folds as data), reset_registry.py (StateResetRegistry: every piece of state, its scope and its
fold-boundary reset), kill.py (Q drift, gradient collapse, non-finite values), metrics.py (validation
figures, flat and buy-and-hold baselines, the oracle reference), probe.py (the ridge probe baseline),
run_folder.py (runs/<name>/: config, folds, metrics.jsonl, checkpoints, summary, resume).

The driver's sequence (tests/walkforward/fake_trainer.py runs it on a fake trainer, killed and resumed):

    run = RunFolder.create(cfg, folds)  |  RunFolder.open(path) + cfg = run.config()      # --resume
    registry = StateResetRegistry(); every component.register_state(registry); register_isv(registry, bus)
    point = run.resume_point(len(folds), expected_fingerprints={"params": layout.fingerprint})
    if point: upload point.checkpoint.arrays; registry.load_host_state(point.checkpoint.registry_state)
    for fold k (from point.fold):
        if k > point.fold or point is None or point.fold_boundary:      # every fold, fold 0 included
            log(format_resets(registry.reset(FoldReset, ResetContext(k, cfg.run.seed, stream)), k))
        baselines once per fold: flat_days, buy_and_hold_days, probe_baseline, OracleReference.sharpe_on
        for epoch e (from point.epoch in the resumed fold):
            collect, train
            kill = kills.check(EpochHealth.from_isv(isv_host, epoch=e, q_mean=q, steps=..., fold_step=...))
            update_q_drift_rate(isv, q_epoch_mean_device, stream=s)         # after the kill check
            days = validation backtest -> [DaySeries]; val = compute_metrics(days, ...)
            line = epoch_line(k, e, val=val, report=fold_report(val, ...), train=..., kill=kill, resets=...)
            run.end_epoch(line, arrays=host copies of every device buffer, registry=registry, best=best,
                          fold_done=kill is not None or e == last, validation=days, fingerprints=...)
            if kill or e == last: break
    run.summarise(annualisation_days=cfg.evaluation.annualisation_days, chosen_by=best.rule)
"""
