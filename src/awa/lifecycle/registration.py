"""Registration of lifecycle hooks and follow-up specs on AsyncClient.

Every method works as a decorator or as a plain call::

    @client.on_event(Signup)
    async def metrics(event: awa.JobEvent[Signup]) -> None: ...

    client.on_completed_enqueue(Signup, lambda args, job: WelcomeEmail(args.user_id, job.id))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, overload

from awa.errors import AwaError
from awa.lifecycle.followups import FollowUpRegistry, FollowUpSpec, Trigger
from awa.lifecycle.hooks import HookRegistry, kind_of

F = TypeVar("F", bound=Callable[..., Any])


class LifecycleRegistration:
    """Mixin of AsyncClient: hooks (``on_event``) and follow-ups (``on_*_enqueue``)."""

    _hooks: HookRegistry
    _follow_ups: FollowUpRegistry

    def _check_not_started(self) -> None:
        if getattr(self, "_runtime", None) is not None:
            raise AwaError("register hooks and follow-ups before start()")

    # Hooks ------------------------------------------------------------------------------

    @overload
    def on_event(
        self, args_type: type[Any], hook: None = None, *, kind: str | None = None
    ) -> Callable[[F], F]: ...

    @overload
    def on_event(self, args_type: type[Any], hook: F, *, kind: str | None = None) -> F: ...

    def on_event(
        self, args_type: type[Any], hook: F | None = None, *, kind: str | None = None
    ) -> F | Callable[[F], F]:
        """Hook every lifecycle event of jobs of ``args_type``; ``event.args`` is decoded
        into it (a row whose args no longer decode skips this hook, with a warning)."""
        return self._hook(kind_of(args_type, kind), args_type, hook)

    @overload
    def on_event_kind(self, kind: str, hook: None = None) -> Callable[[F], F]: ...

    @overload
    def on_event_kind(self, kind: str, hook: F) -> F: ...

    def on_event_kind(self, kind: str, hook: F | None = None) -> F | Callable[[F], F]:
        """Hook every lifecycle event of jobs of ``kind``; ``event.args`` is the JSON."""
        return self._hook(kind, None, hook)

    def _hook(self, kind: str, args_type: type[Any] | None, hook: F | None) -> F | Callable[[F], F]:
        def register(function: F) -> F:
            self._check_not_started()
            self._hooks.add(kind, function, args_type)
            return function

        return register if hook is None else register(hook)

    # Follow-ups ---------------------------------------------------------------------------

    def _follow_up(
        self,
        trigger: Trigger,
        trigger_type: type[Any],
        closure: F | None,
        kind: str | None,
        returns_request: bool,
    ) -> F | Callable[[F], F]:
        job_kind = kind_of(trigger_type, kind)

        def register(function: F) -> F:
            self._check_not_started()
            self._follow_ups.add(
                FollowUpSpec(trigger, job_kind, trigger_type, function, returns_request)
            )
            return function

        return register if closure is None else register(closure)

    @overload
    def on_completed_enqueue(
        self, trigger_type: type[Any], closure: None = None, *, kind: str | None = None
    ) -> Callable[[F], F]: ...

    @overload
    def on_completed_enqueue(
        self, trigger_type: type[Any], closure: F, *, kind: str | None = None
    ) -> F: ...

    def on_completed_enqueue(
        self, trigger_type: type[Any], closure: F | None = None, *, kind: str | None = None
    ) -> F | Callable[[F], F]:
        """When a job of ``trigger_type`` completes, insert ``closure(args, job)`` in the same
        transaction."""
        return self._follow_up(Trigger.COMPLETED, trigger_type, closure, kind, False)

    @overload
    def on_completed_enqueue_with(
        self, trigger_type: type[Any], closure: None = None, *, kind: str | None = None
    ) -> Callable[[F], F]: ...

    @overload
    def on_completed_enqueue_with(
        self, trigger_type: type[Any], closure: F, *, kind: str | None = None
    ) -> F: ...

    def on_completed_enqueue_with(
        self, trigger_type: type[Any], closure: F | None = None, *, kind: str | None = None
    ) -> F | Callable[[F], F]:
        """Like ``on_completed_enqueue``; the closure returns an ``awa.EnqueueRequest``
        (with its options) or None to enqueue nothing."""
        return self._follow_up(Trigger.COMPLETED, trigger_type, closure, kind, True)

    @overload
    def on_cancelled_enqueue(
        self, trigger_type: type[Any], closure: None = None, *, kind: str | None = None
    ) -> Callable[[F], F]: ...

    @overload
    def on_cancelled_enqueue(
        self, trigger_type: type[Any], closure: F, *, kind: str | None = None
    ) -> F: ...

    def on_cancelled_enqueue(
        self, trigger_type: type[Any], closure: F | None = None, *, kind: str | None = None
    ) -> F | Callable[[F], F]:
        """On cancellation: ``closure(args, job, reason)``."""
        return self._follow_up(Trigger.CANCELLED, trigger_type, closure, kind, False)

    @overload
    def on_cancelled_enqueue_with(
        self, trigger_type: type[Any], closure: None = None, *, kind: str | None = None
    ) -> Callable[[F], F]: ...

    @overload
    def on_cancelled_enqueue_with(
        self, trigger_type: type[Any], closure: F, *, kind: str | None = None
    ) -> F: ...

    def on_cancelled_enqueue_with(
        self, trigger_type: type[Any], closure: F | None = None, *, kind: str | None = None
    ) -> F | Callable[[F], F]:
        return self._follow_up(Trigger.CANCELLED, trigger_type, closure, kind, True)

    @overload
    def on_retried_enqueue(
        self, trigger_type: type[Any], closure: None = None, *, kind: str | None = None
    ) -> Callable[[F], F]: ...

    @overload
    def on_retried_enqueue(
        self, trigger_type: type[Any], closure: F, *, kind: str | None = None
    ) -> F: ...

    def on_retried_enqueue(
        self, trigger_type: type[Any], closure: F | None = None, *, kind: str | None = None
    ) -> F | Callable[[F], F]:
        """When an attempt fails and the job will retry:
        ``closure(args, job, error, attempt, next_run_at)``."""
        return self._follow_up(Trigger.RETRIED, trigger_type, closure, kind, False)

    @overload
    def on_retried_enqueue_with(
        self, trigger_type: type[Any], closure: None = None, *, kind: str | None = None
    ) -> Callable[[F], F]: ...

    @overload
    def on_retried_enqueue_with(
        self, trigger_type: type[Any], closure: F, *, kind: str | None = None
    ) -> F: ...

    def on_retried_enqueue_with(
        self, trigger_type: type[Any], closure: F | None = None, *, kind: str | None = None
    ) -> F | Callable[[F], F]:
        return self._follow_up(Trigger.RETRIED, trigger_type, closure, kind, True)

    @overload
    def on_exhausted_enqueue(
        self, trigger_type: type[Any], closure: None = None, *, kind: str | None = None
    ) -> Callable[[F], F]: ...

    @overload
    def on_exhausted_enqueue(
        self, trigger_type: type[Any], closure: F, *, kind: str | None = None
    ) -> F: ...

    def on_exhausted_enqueue(
        self, trigger_type: type[Any], closure: F | None = None, *, kind: str | None = None
    ) -> F | Callable[[F], F]:
        """When the job fails for good: ``closure(args, job, error, attempt)``."""
        return self._follow_up(Trigger.EXHAUSTED, trigger_type, closure, kind, False)

    @overload
    def on_exhausted_enqueue_with(
        self, trigger_type: type[Any], closure: None = None, *, kind: str | None = None
    ) -> Callable[[F], F]: ...

    @overload
    def on_exhausted_enqueue_with(
        self, trigger_type: type[Any], closure: F, *, kind: str | None = None
    ) -> F: ...

    def on_exhausted_enqueue_with(
        self, trigger_type: type[Any], closure: F | None = None, *, kind: str | None = None
    ) -> F | Callable[[F], F]:
        return self._follow_up(Trigger.EXHAUSTED, trigger_type, closure, kind, True)

    @overload
    def on_waiting_for_callback_enqueue(
        self, trigger_type: type[Any], closure: None = None, *, kind: str | None = None
    ) -> Callable[[F], F]: ...

    @overload
    def on_waiting_for_callback_enqueue(
        self, trigger_type: type[Any], closure: F, *, kind: str | None = None
    ) -> F: ...

    def on_waiting_for_callback_enqueue(
        self, trigger_type: type[Any], closure: F | None = None, *, kind: str | None = None
    ) -> F | Callable[[F], F]:
        """When the job parks on an external callback: ``closure(args, job)``
        (``job.callback_id`` is set)."""
        return self._follow_up(Trigger.WAITING_FOR_CALLBACK, trigger_type, closure, kind, False)

    @overload
    def on_waiting_for_callback_enqueue_with(
        self, trigger_type: type[Any], closure: None = None, *, kind: str | None = None
    ) -> Callable[[F], F]: ...

    @overload
    def on_waiting_for_callback_enqueue_with(
        self, trigger_type: type[Any], closure: F, *, kind: str | None = None
    ) -> F: ...

    def on_waiting_for_callback_enqueue_with(
        self, trigger_type: type[Any], closure: F | None = None, *, kind: str | None = None
    ) -> F | Callable[[F], F]:
        return self._follow_up(Trigger.WAITING_FOR_CALLBACK, trigger_type, closure, kind, True)

    @overload
    def on_rescued_enqueue(
        self, trigger_type: type[Any], closure: None = None, *, kind: str | None = None
    ) -> Callable[[F], F]: ...

    @overload
    def on_rescued_enqueue(
        self, trigger_type: type[Any], closure: F, *, kind: str | None = None
    ) -> F: ...

    def on_rescued_enqueue(
        self, trigger_type: type[Any], closure: F | None = None, *, kind: str | None = None
    ) -> F | Callable[[F], F]:
        """After maintenance rescues the job: ``closure(args, job, reason)``. Unlike the
        others this runs in its own transaction after the rescue commits (best-effort)."""
        return self._follow_up(Trigger.RESCUED, trigger_type, closure, kind, False)

    @overload
    def on_rescued_enqueue_with(
        self, trigger_type: type[Any], closure: None = None, *, kind: str | None = None
    ) -> Callable[[F], F]: ...

    @overload
    def on_rescued_enqueue_with(
        self, trigger_type: type[Any], closure: F, *, kind: str | None = None
    ) -> F: ...

    def on_rescued_enqueue_with(
        self, trigger_type: type[Any], closure: F | None = None, *, kind: str | None = None
    ) -> F | Callable[[F], F]:
        return self._follow_up(Trigger.RESCUED, trigger_type, closure, kind, True)
