"""The order of a session's runs: blocks of every lane's repeat of each point, in the rotated
order (harness.core.design), and when a point gets another block (the sequential rule, the
budget, --target-ci). Two schedules: fresh engine instances per block (:meth:`BlockSchedule.run_blocks`),
or one instance per lane with a point's repeats the inner loop (:meth:`BlockSchedule.repeat_point`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from engines.common.heap import rss_mb, trim_heap
from harness.analysis.comparisons.paired import precise_enough
from harness.core.design import build_order, lane_order
from harness.core.results import Cell, Run
from harness.run.lanes import Lane, StopFlag, close_lanes
from harness.run.plan import Point, RunPlan
from harness.run.stopping import Stopper


class Runs(Protocol):
    """What the schedule asks of :class:`harness.run.session.Session` (its public API)."""

    stop: StopFlag
    done: set[str]
    stopper: Stopper | None
    rss_after_block_mb: list[float | None]
    heap_trimmed_mb: list[float | None]

    async def start_lane(self, lane: Lane, cells: Sequence[Cell] | None = None) -> None: ...

    async def run_cell(
        self, lane: Lane, cell: Cell, p: Point, warmup: bool, index: int, block: int, position: int
    ) -> Run: ...

    def runs_of(self, p: Point, before: float = float("inf")) -> list[Run]: ...

    def elapsed(self) -> float: ...

    def built_in(self, block: int) -> list[str]: ...


def keeps_repeating(run: Run) -> bool:
    """Whether a lane goes on repeating a point after ``run``: it was ok, or saturated (a
    finding, not a failure: the point's later blocks still run)."""
    return run.status == "ok" or run.status.startswith("saturated")


class BlockSchedule:
    """Which run of a :class:`harness.run.session.Session` goes in which block; it runs them
    through the session's public API (``start_lane``, ``run_cell``, ``runs_of``, ``elapsed``,
    ``built_in``) and keeps only the rotation's count of its own."""

    def __init__(self, plan: RunPlan, session: Runs) -> None:
        self.plan = plan
        self.session = session
        self.blocks = 0  # blocks (one repeat of every lane) so far, one instance: the rotation

    async def run_blocks(self, lanes: list[Lane]) -> None:
        """Fresh engine instances per block: for block r, build every lane that has a cell to
        run (seeded order per block, recorded), run repeat r of every point still repeating
        (lanes in the rotated order), close them. An instance's own speed offset then varies
        between blocks, where the CI (over blocks) sees it. Blocks after the first --repeats
        go to the points still repeating (_repeating), while the budget admits them."""
        session = self.session
        points = list(self.plan.points())
        halted: set[tuple[int, int]] = set()  # (lane, point) whose run failed: no more repeats
        dead: set[int] = set()  # lanes whose engine did not start
        failed: set[int] = set()  # points with no lane left: each one dead or halted there
        for block in range(self.plan.max_repeats + (session.stopper is not None)):  # +1: cap look
            if session.stop:
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
                if cell.key not in session.done
            }
            if wanted and not todo:  # every cell journaled (--resume): no time, no budget
                continue
            here = {i: session.runs_of(points[i], block) for i in wanted}
            stopper = session.stopper
            fits = stopper is None or stopper.admits(here, block, session.elapsed())
            if not wanted or not fits:
                break
            await self._block(lanes, points, block, todo, halted, dead)
            for i in wanted:
                if all(k in dead or (k, i) in halted for k in range(len(lanes))):
                    failed.add(i)
                    if session.stopper is not None:
                        session.stopper.failed(session.runs_of(points[i]))

    def _repeating(self, lanes: list[Lane], p: Point, block: int, since: Any = None) -> bool:
        """Whether point ``p`` gets a repeat in ``block``: the sequential rule (``since``: when
        the point began, where points share the budget, harness.run.stopping); else the first
        --repeats, then while --target-ci asks for more (precise_enough)."""
        here = self.session.runs_of(p, block)
        if self.session.stopper is not None:
            return self.session.stopper.wants(here, block, self.session.elapsed(), since)
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
        session = self.session
        built = session.built_in(block)
        live = sorted({k for k, _ in todo})  # orders over the lanes with cells here, balanced
        try:
            for j in build_order(len(live), self.plan.seed, block):
                if session.stop:
                    break
                k = live[j]
                await session.start_lane(
                    lanes[k], [c for (m, _), c in sorted(todo.items()) if m == k]
                )
                if lanes[k].engine is None:
                    dead.add(k)
                else:  # the record lists only engines built
                    built.append(lanes[k].name)
            for i in sorted({i for _, i in todo}):
                present = [k for k in live if (k, i) in todo and lanes[k].engine is not None]
                order = [present[m] for m in lane_order(len(present), block + i, self.plan.seed)]
                for position, k in enumerate(order):
                    if session.stop:
                        break
                    run = await session.run_cell(
                        lanes[k], todo[(k, i)], points[i], True, i, block, position
                    )
                    # fresh instances: every run warms up
                    if not keeps_repeating(run):
                        halted.add((k, i))
        finally:
            try:
                await close_lanes(lanes)
            finally:  # after the close (even a cancelled one), freed heap back to the OS
                session.heap_trimmed_mb.append(trim_heap())
                session.rss_after_block_mb.append(rss_mb())

    async def repeat_point(self, lanes: list[Lane], p: Point, index: int) -> None:
        """Repeats of one point, every lane once per repeat in the design's rotated order, while
        :meth:`_repeating` asks for more (up to --max-repeats)."""
        session = self.session
        warm: set[int] = set()
        active = list(lanes)
        repeat = 0
        t_point = session.elapsed()
        while active and not session.stop:
            order = [lanes[k] for k in lane_order(len(lanes), self.blocks, self.plan.seed)]
            self.blocks += 1
            position = 0
            for lane in order:
                if session.stop:
                    break
                if lane not in active:
                    continue
                cell = self.plan.cell(lane.config.engine, lane.label, p, repeat)
                if cell.key in session.done:
                    continue
                run = await session.run_cell(
                    lane, cell, p, id(lane) not in warm, index, repeat, position
                )
                position += 1
                warm.add(id(lane))
                if not keeps_repeating(run):
                    active.remove(lane)
            repeat += 1
            if not active:  # every lane's run failed: the point stops where they did
                if session.stopper is not None:
                    session.stopper.failed(session.runs_of(p))
                break
            if not self._repeating(lanes, p, repeat, t_point) or repeat >= self.plan.max_repeats:
                break
