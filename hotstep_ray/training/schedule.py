"""The LR schedule, the 5-epoch moving average, the stop rule and milestone selection.

LR (HOT-Step / Side-Step-exact, shared by both trainers), for optimizer step s = 0 … total−1:

    s <  warmup:  f(s) = s / warmup                               (f(0) = 0, f(warmup) = 1)
    s >= warmup:  f(s) = floor + (1 − floor)·½(1 + cos(π·p)),
                  p = (s − warmup) / (total − 1 − warmup)

so the last step runs at exactly `floor` (10%) of the peak. Counts come from
`core.contracts.schedule_steps` (warmup = max(50, total·ratio), capped at half the run). The
factor multiplies each param group's `base_lr`, so Muon's ×20 LR follows the same shape.

Milestones — our reading of HOT-Step's `milestone_step` (0–5, 0 = off; DiT 0.1 on ma5, LM 1.0 on
the epoch loss): rungs sit at multiples of `milestone_step`; a milestone `loss_<rung>` is saved the
first time the tracked loss reaches a rung (loss ≤ k·step) below every rung reached before, once
per drop (a fall across several rungs saves one, named for the lowest). The first epoch only sets
the starting rung. `keep` holds the N lowest-loss milestones (0 = keep all: "off" is step 0).
Optionally also one every N epochs (`epoch_<n>`), pruned by the same keep-best rule.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from hotstep_ray.core.contracts import schedule_steps

LR_FLOOR = 0.1


def lr_factor(step: int, total_steps: int, warmup_steps: int, floor: float = LR_FLOOR) -> float:
    """Multiplier of the peak LR at optimizer step `step` (0-based); see the module docstring."""
    if step < warmup_steps:
        return step / warmup_steps
    span = max(1, total_steps - 1 - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class LrSchedule:
    total_steps: int
    warmup_steps: int
    floor: float = LR_FLOOR
    steps_per_epoch: int = 0  # informational (from `from_counts`)

    @classmethod
    def from_counts(
        cls, samples: int, epochs: int, batch: int, grad_accum: int, warmup_ratio: float
    ) -> LrSchedule:
        per_epoch, total, warmup = schedule_steps(samples, epochs, batch, grad_accum, warmup_ratio)
        return cls(total_steps=total, warmup_steps=warmup, steps_per_epoch=per_epoch)

    def factor(self, step: int) -> float:
        return lr_factor(step, self.total_steps, self.warmup_steps, self.floor)

    def moved(self, steps: int) -> bool:
        """Whether any of the first `steps` optimizer steps ran with a non-zero factor: lr(0) = 0,
        so an adapter whose only steps ran there is still its initialisation (LoRA's B = 0, a
        do-nothing adapter) and no epoch that ended then may be kept as the best."""
        return any(self.factor(step) > 0 for step in range(steps))

    def apply(self, optimizer: Any, step: int) -> float:
        """Set every group's `lr = base_lr · f(step)` before `optimizer.step()`; returns f.
        A group without `base_lr` (a plain torch optimizer) takes its current lr as the peak."""
        factor = self.factor(step)
        for group in optimizer.param_groups:
            group["lr"] = group.setdefault("base_lr", group["lr"]) * factor
        return factor

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class MovingAverage:
    """Mean of the last `window` values (fewer while filling); `full` once it holds `window`."""

    def __init__(self, window: int = 5) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        self._values: deque[float] = deque(maxlen=window)

    def update(self, value: float) -> float:
        self._values.append(float(value))
        return self.value

    @property
    def value(self) -> float:
        return sum(self._values) / len(self._values) if self._values else math.nan

    @property
    def full(self) -> bool:
        return len(self._values) == self.window

    def state_dict(self) -> dict[str, Any]:
        return {"window": self.window, "values": list(self._values)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.window = int(state["window"])
        self._values = deque((float(v) for v in state["values"]), maxlen=self.window)


StopReason = Literal["target", "epochs", "non_finite"]


@dataclass(frozen=True)
class StopDecision:
    stop: bool
    reason: StopReason | None = None
    moving_average: float | None = None
    last_good_epoch: int = 0  # newest epoch with a finite loss: keep its checkpoint


class StopRule:
    """Epoch cap, target loss on the `window`-epoch moving average (checked once the window is
    full, so one lucky epoch cannot stop a run; 0 = off), and NaN/Inf at any step or epoch."""

    def __init__(self, max_epochs: int, target_loss: float = 0.0, window: int = 5) -> None:
        self.max_epochs = max_epochs
        self.target_loss = target_loss
        self.average = MovingAverage(window)
        self.last_good_epoch = 0

    def check_step(self, loss: float) -> StopDecision:
        if math.isfinite(loss):
            return StopDecision(False, last_good_epoch=self.last_good_epoch)
        return StopDecision(True, "non_finite", last_good_epoch=self.last_good_epoch)

    def end_epoch(self, epoch: int, loss: float) -> StopDecision:
        """Call after epoch `epoch` (1-based) with its mean loss."""
        if not math.isfinite(loss):
            return StopDecision(True, "non_finite", last_good_epoch=self.last_good_epoch)
        self.last_good_epoch = epoch
        average = self.average.update(loss)
        if self.target_loss > 0 and self.average.full and average <= self.target_loss:
            return StopDecision(True, "target", average, epoch)
        if epoch >= self.max_epochs:
            return StopDecision(True, "epochs", average, epoch)
        return StopDecision(False, None, average, epoch)

    def state_dict(self) -> dict[str, Any]:
        return {"average": self.average.state_dict(), "last_good_epoch": self.last_good_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.average.load_state_dict(state["average"])
        self.last_good_epoch = int(state["last_good_epoch"])


@dataclass(frozen=True)
class Milestone:
    name: str  # folder name: `loss_0.3` (ladder) or `epoch_50` (periodic)
    epoch: int
    loss: float


@dataclass(frozen=True)
class MilestoneDecision:
    save: Milestone | None = None  # write this one now
    evict: tuple[Milestone, ...] = ()  # delete these (pushed out of the best `keep`)


def _rung_label(value: float) -> str:
    return f"{round(value, 6):g}"


@dataclass
class MilestoneTracker:
    """Decides which epochs become milestones; the trainer writes/deletes the folders."""

    step: float = 0.0  # loss ladder spacing; 0 = off
    keep: int = 6  # lowest-loss milestones kept; 0 = all
    every_epochs: int = 0  # also one every N epochs; 0 = off
    rung: int | None = None  # index k of the lowest rung reached (rung value k·step)
    kept: list[Milestone] = field(default_factory=list)

    def observe(self, epoch: int, loss: float) -> MilestoneDecision:
        if not math.isfinite(loss):
            return MilestoneDecision()
        candidate = None
        if self.step > 0:
            # Smallest k with loss <= k·step; the epsilon absorbs 0.3/0.1 = 2.9999999999999996.
            k = math.ceil(loss / self.step - 1e-9)
            if self.rung is not None and k < self.rung:
                candidate = Milestone(f"loss_{_rung_label(k * self.step)}", epoch, loss)
            self.rung = k if self.rung is None else min(self.rung, k)
        if candidate is None and self.every_epochs > 0 and epoch % self.every_epochs == 0:
            candidate = Milestone(f"epoch_{epoch}", epoch, loss)
        if candidate is None:
            return MilestoneDecision()
        pool = sorted([*self.kept, candidate], key=lambda m: (m.loss, -m.epoch))
        survivors = pool if self.keep <= 0 else pool[: self.keep]
        evicted = tuple(m for m in self.kept if m not in survivors)
        self.kept = survivors
        return MilestoneDecision(candidate if candidate in survivors else None, evicted)

    def state_dict(self) -> dict[str, Any]:
        return {"rung": self.rung, "kept": [asdict(m) for m in self.kept]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rung = state["rung"]
        self.kept = [Milestone(**m) for m in state["kept"]]
