"""Adapter evaluation and calibration (issue 12): pick the best milestone and scale by measurement.

metrics        LM code-statistics distances, memorisation and length guards, latent Fréchet distance
runs           a run folder's candidates (its adapter + milestones), log, trigger, dataset keys
prompts        the dataset songs as prompts with fixed seeds
grid           work items (candidate x scale, same prompts), results, the winner rule
lm_calibrate   LM: codes through `PlannerLM`, scored against the dataset's codes
dit_calibrate  DiT: latents through `DitAudition`'s sampler, latent Fréchet against the cache
bake           the winner folded into `<run>-calibrated/` with `hot_step_eval.json`
recipe         the steps both kinds share: read the run, plan the grid, run it, score, bake
after_train    train, then calibrate: the `calibrate` option, composed above the trainers
ray_calibrate  run the work items in this process or on Ray actors
report         progress / eval events and the outcome shared by both kinds
"""
