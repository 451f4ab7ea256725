"""Model-independent training core shared by the DiT and LM trainers.

- `adapters`: one interface for LoRA and LoKR (peft) over any `nn.Module`.
- `optim`: hybrid Muon (2-D parameters) + AdamW (everything else).
- `schedule`: the exact warmup + cosine-to-10% LR shape, moving average, stop rule, milestones.
- `accumulate`: gradient-accumulation weights by element share and the masked MSE.
- `export`: PEFT LoRA / LyCORIS LoKR writers and readers, trigger metadata, delta report.
- `checkpoint`: resumable, pickle-free checkpoints through `Storage`.
- `holdout`: held-out songs and their per-epoch loss (`eval` events) for both trainers.
"""
