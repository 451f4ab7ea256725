"""Do torch.compile'd DiT blocks give the eager gradients? Tiny DiT (float32) and the full 2B
(bfloat16) with a LoRA, eager vs dynamo+AOTAutograd vs Inductor (default, reduce-overhead).

    python bench/dit_compile_check.py cuda     (H200: matches; docs/BENCHMARKS.md)
    python bench/dit_compile_check.py cpu      (Inductor's CPU code: wrong gradients)
"""

import copy
import sys
from pathlib import Path

import torch
import torch._dynamo as dynamo

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from the checkout

from hotstep_ray.models import full_configs as fc  # noqa: E402
from hotstep_ray.models.tiny_dit import tiny_config  # noqa: E402
from hotstep_ray.training import adapters  # noqa: E402
from hotstep_ray.training.adapters import AdapterSpec  # noqa: E402

dynamo.config.cache_size_limit = 64
device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
for layout in ("turbo", "2b-full"):
    cfg = tiny_config("turbo") if layout == "turbo" else fc.dit_config("2b")
    for dtype in (torch.float32,) if layout == "turbo" else (torch.bfloat16,):
        torch.manual_seed(0)
        models = fc.build_dit(cfg, device=device, dtype=dtype, silence_frames=64)
        tr = models.transformer
        adapters.inject(tr, AdapterSpec(rank=4, alpha=8))
        g = torch.Generator(device="cpu").manual_seed(1)
        for _, p in adapters.trainable_parameters(tr):
            p.data = (0.05 * torch.randn(p.shape, generator=g)).to(device, p.dtype)
        T, L = (16, 8) if layout == "turbo" else (512, 64)
        H = tr.config.hidden_size
        x = torch.randn(1, T, 64, generator=g).to(device, dtype)
        ctx = torch.randn(1, T, 128, generator=g).to(device, dtype)
        enc = torch.randn(1, L, H, generator=g).to(device, dtype)
        t = torch.tensor([0.6], device=device, dtype=dtype)

        def run(model, x=x, t=t, enc=enc, ctx=ctx):
            for p in model.parameters():
                p.grad = None
            out = model(
                hidden_states=x,
                timestep=t,
                timestep_r=t,
                encoder_hidden_states=enc,
                context_latents=ctx,
                return_dict=False,
            )[0]
            loss = (out.float() ** 2).mean()
            loss.backward()
            grads = adapters.trainable_parameters(model)
            return loss.item(), {n: p.grad.float().clone() for n, p in grads}

        l0, g0 = run(tr)
        for mode in ("aot_eager", "default", "reduce-overhead"):
            m = copy.deepcopy(tr)
            for b in m.layers:
                if mode == "aot_eager":
                    b.compile(backend="aot_eager", dynamic=False)
                else:
                    b.compile(mode=None if mode == "default" else mode, dynamic=False)
            for _ in range(2):
                l1, g1 = run(m)
            errs = sorted(((g1[n] - g0[n]).norm() / g0[n].norm()).item() for n in g0)
            print(
                f"{layout} {dtype} {mode}: loss {l0:.6f} vs {l1:.6f}, grad rel err median "
                f"{errs[len(errs) // 2]:.2e} max {errs[-1]:.2e}",
                flush=True,
            )
