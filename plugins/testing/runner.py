"""Runs checks against one backend: creates and starts it once, runs each check under a time
limit, turns what happened into a `Verdict`, and closes the backend at the end."""

from __future__ import annotations

import asyncio
import time

from plugins.testing.checks import lifecycle as _registered  # noqa: F401 - importing registers every check
from plugins.testing.probe import Probe
from plugins.testing.registry import CHECKS, Check, Skipped, Verdict, ordered
from plugins.testing.specs import SpecBuilder
from plugins.testing.subject import Subject
from plugins.testing.trace import Failed, describe_error

CHECK_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 120.0


class Battery:
    """The checks against one subject, its requests built by `build_spec` (the gateway's own: see
    `plugins.testing.specs`)."""

    def __init__(self, subject: Subject, *, build_spec: SpecBuilder, check_timeout_s: float = CHECK_TIMEOUT_S,
                 request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.subject = subject
        self.build_spec = build_spec
        self.check_timeout_s = check_timeout_s
        self.request_timeout_s = request_timeout_s
        self.probe: Probe | None = None
        self.create_error: BaseException | None = None

    async def open(self) -> None:
        if self.probe is not None or self.create_error is not None:
            return
        try:
            backend = self.subject.create()
        except Exception as exc:  # noqa: BLE001 - reported by every check
            self.create_error = exc
            return
        self.probe = Probe(backend, build_spec=self.build_spec, model=self.subject.model,
                           request_timeout_s=self.request_timeout_s)
        await self.probe.open()

    async def run(self, name: str) -> Verdict:
        began = time.perf_counter()
        verdict = await self._verdict(CHECKS[name])
        verdict.elapsed_s = time.perf_counter() - began
        return verdict

    async def _verdict(self, check: Check) -> Verdict:
        name = check.name
        await self.open()
        probe = self.probe
        if probe is None:
            return Verdict(name, "fail", f"creating the backend raised {describe_error(self.create_error)}",  # type: ignore[arg-type]
                           fix=CHECKS["lifecycle"].fix)
        if check.needs_model and not probe.ready:
            why = "the backend was closed" if probe.closed else "the backend cannot serve (see lifecycle)"
            return Verdict(name, "skip", why)
        timeout = asyncio.timeout(self.check_timeout_s)
        try:
            async with timeout:
                message = await check.run(probe)
        except Failed as failed:
            return Verdict(name, "fail", failed.message, [t.show() for t in failed.traces], check.fix)
        except Skipped as skipped:
            return Verdict(name, "skip", str(skipped))
        except TimeoutError as exc:
            if not timeout.expired():
                return Verdict(name, "fail", f"the backend raised {describe_error(exc)}", fix=check.fix)
            return Verdict(name, "fail", f"the check did not finish within {self.check_timeout_s:g} s", fix=check.fix)
        except Exception as exc:  # noqa: BLE001 - e.g. health() or tokenize() raising
            return Verdict(name, "fail", f"the backend raised {describe_error(exc)}", fix=check.fix)
        return Verdict(name, "pass", message)

    async def run_all(self, names: list[str] | None = None) -> list[Verdict]:
        try:
            return [await self.run(check.name) for check in ordered(names)]
        finally:
            await self.shutdown()

    async def shutdown(self) -> None:
        """Close the backend unless the close check did (or it never was made)."""
        probe = self.probe
        if probe is not None and not probe.closed:
            probe.closed = True
            try:
                await probe.backend.close()
            except Exception:  # noqa: BLE001 - the close check reports this when it runs
                pass


async def run_battery(subject: Subject, names: list[str] | None = None, *, build_spec: SpecBuilder,
                      **limits: float) -> list[Verdict]:
    """Every check (or those named) against a fresh backend, in order; its verdicts."""
    return await Battery(subject, build_spec=build_spec, **limits).run_all(names)
