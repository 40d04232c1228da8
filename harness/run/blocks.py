"""The order of a session's runs: blocks of every lane's repeat of each point, in the rotated
order (harness.core.design), and when a point gets another block (the sequential rule, the
budget, --target-ci). Two schedules: fresh engine instances per block (:meth:`_run_blocks`), or
one instance per lane with a point's repeats the inner loop (:meth:`_repeat_point`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from engines.common.heap import rss_mb, trim_heap
from harness.analysis.comparisons.paired import precise_enough
from harness.core.design import build_order, lane_order
from harness.core.results import Cell, Run
from harness.run.lanes import Lane, StopFlag, close_lanes
from harness.run.plan import Point, RunPlan
from harness.run.stopping import Stopper


class BlockSchedule:
    """What :class:`harness.run.session.Session` runs in which block; the session provides the
    fields below, :meth:`start_lane`, :meth:`run_cell` and :meth:`_built`."""

    plan: RunPlan
    clock: Callable[[], float]
    stop: StopFlag
    runs: list[Run]
    done: set[str]
    stopper: Stopper | None
    rss_after_block_mb: list[float | None]
    heap_trimmed_mb: list[float | None]
    _t0: float
    _blocks: int

    async def _run_blocks(self, lanes: list[Lane]) -> None:
        """Fresh engine instances per block: for block r, build every lane that has a cell to
        run (seeded order per block, recorded), run repeat r of every point still repeating
        (lanes in the rotated order), close them. An instance's own speed offset then varies
        between blocks, where the CI (over blocks) sees it. Blocks after the first --repeats
        go to the points still repeating (_repeating), while the budget admits them."""
        points = list(self.plan.points())
        halted: set[tuple[int, int]] = set()  # (lane, point) whose run failed: no more repeats
        dead: set[int] = set()  # lanes whose engine did not start
        failed: set[int] = set()  # points with no lane left: each one dead or halted there
        for block in range(self.plan.max_repeats + (self.stopper is not None)):  # +1: cap look
            if self.stop:
                break
            wanted = [
                i
                for i, p in enumerate(points)
                if i not in failed and self._repeating(lanes, p, block)
            ]
            todo = {
                (k, i): cell
                for k, lane in enumerate(lanes)
                for i in wanted
                if k not in dead and (k, i) not in halted
                for cell in [self.plan.cell(lane.config.engine, lane.label, points[i], block)]
                if cell.key not in self.done
            }
            if wanted and not todo:  # every cell journaled (--resume): no time, no budget
                continue
            here = {i: self._here(points[i], block) for i in wanted}
            fits = self.stopper is None or self.stopper.admits(here, block, self.clock() - self._t0)
            if not wanted or not fits:
                break
            await self._block(lanes, points, block, todo, halted, dead)
            for i in wanted:
                if all(k in dead or (k, i) in halted for k in range(len(lanes))):
                    failed.add(i)
                    if self.stopper is not None:
                        self.stopper.failed(self._here(points[i]))

    def _here(self, p: Point, before: float = float("inf")) -> list[Run]:
        """The point's runs, any lane, of blocks before ``before`` (a --resume holds later ones)."""
        group = self.plan.cell("", "", p, 0).group
        return [r for r in self.runs if r.cell.group == group and r.cell.repeat < before]

    def _repeating(self, lanes: list[Lane], p: Point, block: int, since: Any = None) -> bool:
        """Whether point ``p`` gets a repeat in ``block``: the sequential rule (``since``: when
        the point began, where points share the budget, harness.run.stopping); else the first
        --repeats, then while --target-ci asks for more (precise_enough)."""
        here = self._here(p, block)
        if self.stopper is not None:
            return self.stopper.wants(here, block, self.clock() - self._t0, since)
        if block < self.plan.repeats:
            return True
        if self.plan.target_ci is None:
            return False
        return not precise_enough(here, self.plan.target_ci)

    async def _block(
        self,
        lanes: list[Lane],
        points: Sequence[Point],
        block: int,
        todo: dict[tuple[int, int], Cell],
        halted: set[tuple[int, int]],
        dead: set[int],
    ) -> None:
        built = self._built(block)
        live = sorted({k for k, _ in todo})  # orders over the lanes with cells here, balanced
        try:
            for j in build_order(len(live), self.plan.seed, block):
                if self.stop:
                    break
                k = live[j]
                await self.start_lane(lanes[k], [c for (m, _), c in sorted(todo.items()) if m == k])
                if lanes[k].engine is None:
                    dead.add(k)
                else:  # the record lists only engines built
                    built.append(lanes[k].name)
            for i in sorted({i for _, i in todo}):
                present = [k for k in live if (k, i) in todo and lanes[k].engine is not None]
                order = [present[m] for m in lane_order(len(present), block + i, self.plan.seed)]
                for position, k in enumerate(order):
                    if self.stop:
                        break
                    run = await self.run_cell(
                        lanes[k], todo[(k, i)], points[i], True, i, block, position
                    )
                    # fresh instances: every run warms up; a saturated run is a finding, not
                    # a failure (the point's later blocks still run, as with one instance)
                    if run.status != "ok" and not run.status.startswith("saturated"):
                        halted.add((k, i))
        finally:
            try:
                await close_lanes(lanes)
            finally:  # after the close (even a cancelled one), freed heap back to the OS
                self.heap_trimmed_mb.append(trim_heap())
                self.rss_after_block_mb.append(rss_mb())

    async def _repeat_point(self, lanes: list[Lane], p: Point, index: int) -> None:
        """Repeats of one point, every lane once per repeat in the design's rotated order, while
        :meth:`_repeating` asks for more (up to --max-repeats)."""
        warm: set[int] = set()
        active = list(lanes)
        repeat = 0
        t_point = self.clock() - self._t0
        while active and not self.stop:
            order = [lanes[k] for k in lane_order(len(lanes), self._blocks, self.plan.seed)]
            self._blocks += 1
            position = 0
            for lane in order:
                if self.stop:
                    break
                if lane not in active:
                    continue
                cell = self.plan.cell(lane.config.engine, lane.label, p, repeat)
                if cell.key in self.done:
                    continue
                run = await self.run_cell(
                    lane, cell, p, id(lane) not in warm, index, repeat, position
                )
                position += 1
                warm.add(id(lane))
                if run.status != "ok" and not run.status.startswith("saturated"):  # it repeats
                    active.remove(lane)
            repeat += 1
            if not active:  # every lane's run failed: the point stops where they did
                if self.stopper is not None:
                    self.stopper.failed(self._here(p))
                break
            if not self._repeating(lanes, p, repeat, t_point) or repeat >= self.plan.max_repeats:
                break
