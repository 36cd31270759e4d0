"""The eviction policy as a pure function."""

import pytest

from mlxd.supervisor.policy.eviction import DoesNotFit, Resident, plan_eviction

GB = 1 << 30


def r(id, gb, leases=0, used=0.0, pinned=False, evictable=True):
    return Resident(id, int(gb * GB), leases, used, pinned, evictable)


def test_fits_without_eviction():
    assert plan_eviction([r("a", 2)], 2 * GB, 8 * GB, 0) == []


def test_evicts_least_recently_used_idle_first():
    res = [r("old", 3, used=1), r("new", 3, used=5), r("mid", 3, used=3)]
    assert plan_eviction(res, 3 * GB, 10 * GB, 0) == ["old"]
    assert plan_eviction(res, 6 * GB, 10 * GB, 0) == ["old", "mid"]


def test_never_evicts_busy_or_pinned_or_starting():
    res = [
        r("busy", 4, leases=1, used=0),
        r("pin", 2, pinned=True),
        r("start", 2, evictable=False),
        r("idle", 1, used=9),
    ]
    assert plan_eviction(res, 2 * GB, 10 * GB, 0) == ["idle"]
    assert plan_eviction(res, 4 * GB, 10 * GB, 0) is None  # only busy ones stand in the way


def test_max_loaded_models_counts_too():
    res = [r("a", 1, used=2), r("b", 1, used=1)]
    assert plan_eviction(res, GB, 100 * GB, 2) == ["b"]
    assert plan_eviction(res, GB, 100 * GB, 3) == []


def test_too_big_for_the_budget_raises():
    with pytest.raises(DoesNotFit):
        plan_eviction([], 9 * GB, 8 * GB, 0)
    with pytest.raises(DoesNotFit):
        plan_eviction([r("pin", 6, pinned=True)], 3 * GB, 8 * GB, 0)
