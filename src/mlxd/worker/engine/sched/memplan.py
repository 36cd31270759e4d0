"""The worker's memory plan: pure math, in shared/memory_plan.py (the fit report uses it too)."""

from mlxd.shared.memory_plan import HEADROOM_FRACTION, MemoryPlan, plan_memory

__all__ = ["HEADROOM_FRACTION", "MemoryPlan", "plan_memory"]
