"""bench.calibration: the machine-speed figure every benchmark report carries."""

from __future__ import annotations

from bench import calibration


def test_the_workload_is_the_one_named() -> None:
    assert calibration._work() == sum(i * i % 7 for i in range(2_000_000))


def test_speed_is_the_least_of_the_tries() -> None:
    ticks = iter([0.0, 0.5, 1.0, 1.2, 2.0, 2.9])  # tries of 0.5, 0.2 and 0.9 s
    ran: list[int] = []
    got = calibration.python_speed(tries=3, clock=lambda: next(ticks), work=lambda: ran.append(1))
    assert got == {"python_workload_ms": 200.0, "workload": calibration.WORKLOAD} and len(ran) == 3
