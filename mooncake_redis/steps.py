"""Steps: the operations of the hot path written once, for a blocking and an asynchronous caller.

A step function is a generator that yields the commands of one round trip (a list, run as one
pipeline) or a Blocking call, receives their replies (as Shards.run returns them, errors
raised), and returns the result. Master runs steps with `drive` (a blocking round trip each);
the Mooncake gateway (mooncake_redis/gateway) runs the same steps on its event loop."""
from __future__ import annotations

from typing import Any, Callable, Generator, TypeVar

T = TypeVar("T")
Steps = Generator[Any, Any, T]


class Blocking:
    """A step that is a plain blocking call (rare: a radix outbox drain after a put); an
    asynchronous driver runs it on a thread."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn


def drive(steps: Steps[T], run: Callable[[list], list]) -> T:
    """Run steps to their result, each round trip through `run`."""
    try:
        step = next(steps)
        while True:
            step = steps.send(step.fn() if isinstance(step, Blocking) else run(step))
    except StopIteration as done:
        return done.value
